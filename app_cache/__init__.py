"""What every process keeps in memory for the hot paths, and how a change reaches every process.

`changes.ChangeFeed` carries "topic X changed" (a version row in the database, plus Redis pub/sub
when configured); `applications.ApplicationCache` and `keys.signing.KeyRing` listen to it.
Changes are announced by the lifecycle functions that make them (`lifecycle/`), nowhere else.
"""
