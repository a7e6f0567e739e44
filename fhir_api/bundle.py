"""Search results as a FHIR `searchset` Bundle: `total`, `link` self/next, entries with `fullUrl`."""
from __future__ import annotations

from urllib.parse import urlencode


def search_url(base_url: str, resource_type: str, args: dict[str, list[str]], **replace) -> str:
    """`{base}/{Type}?...` with the search's parameters (sorted), `replace` overriding some."""
    params = {name: list(values) for name, values in args.items()}
    params.update({name: [str(value)] for name, value in replace.items()})
    pairs = [(name, value) for name in sorted(params) for value in params[name]]
    return f"{base_url}/{resource_type}" + (f"?{urlencode(pairs)}" if pairs else "")


def searchset(base_url: str, resources: list[dict], total: int | None, self_url: str,
              next_url: str | None, included: list[dict] = (), outcomes: list[dict] = ()) -> dict:
    """The Bundle of one page of matches, then the resources `included` (`search.mode` include),
    then the OperationOutcomes about the search (`search.mode` outcome: e.g. an include left out)."""
    bundle = {"resourceType": "Bundle", "type": "searchset"}
    if total is not None:
        bundle["total"] = total
    bundle["link"] = [{"relation": "self", "url": self_url}] + ([{"relation": "next", "url": next_url}] if next_url else [])
    bundle["entry"] = [{"fullUrl": f"{base_url}/{r['resourceType']}/{r['id']}", "resource": r,
                        "search": {"mode": "match"}} for r in resources]
    bundle["entry"] += [{"fullUrl": f"{base_url}/{r['resourceType']}/{r['id']}", "resource": r,
                         "search": {"mode": "include"}} for r in included]
    bundle["entry"] += [{"resource": outcome, "search": {"mode": "outcome"}} for outcome in outcomes]
    return bundle
