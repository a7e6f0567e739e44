"""The sandbox EHR hub: its sign-in, sessions and sandbox tokens (`hub.sandbox`), what it shows a user
(`hub.view`), the launches it creates (`hub.launches`) and its introspection call
(`hub.introspection`). Its pages are `handlers/sandbox_hub.py` and `handlers/sandbox_api.py`."""
