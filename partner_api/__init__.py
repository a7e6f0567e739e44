"""Rules of the partner REST API (`/v1`, client-credentials tokens), free of HTTP.

`handlers/rest/` parses requests and renders; everything an operation decides lives here:
who the caller is (`auth`), where it may call from (`network`), what it may see (`access`),
listings (`directory`), invitations, appointment pages, chart requests and the OpenAPI document.
"""
