"""The partner REST API's HTTP layer: thin handlers over `partner_api` (mounted from `server.py`)."""
