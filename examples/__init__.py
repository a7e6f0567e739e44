"""Runnable examples of what a partner builds against svc-auth."""
