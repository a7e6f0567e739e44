"""Billing rules that need only the models: the free trial (`billing.free_trial`).

Billable use itself (`lifecycle/billing.py`) asks `lifecycle.activation`, so it stays in `lifecycle/`;
this package sits below both `oauth/` (the ID token's trial claims) and `lifecycle/` (activation starts
the trial), so each may import it.
"""
