"""Chart ZIPs in tests: fetch one through the REST API, wait for it, open it with its password."""
from __future__ import annotations

import asyncio
import io
import json

import pypdf
import pytest
import pyzipper


async def fetch_zip(api, url, runtime):
    path = url[len(runtime.settings.public_url):]
    response = await api.http.fetch(api.base_url + path, raise_error=False)
    return response


def open_archive(data: bytes, request_id: str, password: str) -> tuple[str, dict]:
    """The PDF's text and the JSON of a chart ZIP (fails without the right password)."""
    with pyzipper.AESZipFile(io.BytesIO(data)) as archive:
        assert sorted(archive.namelist()) == [f"{request_id}.json", f"{request_id}.pdf"]
        for info in archive.infolist():
            assert info.flag_bits & 0x1, "entries are encrypted"
        with pytest.raises(RuntimeError):
            archive.read(f"{request_id}.json", pwd=b"wrong-password")
        archive.setpassword(password.encode())
        pdf = pypdf.PdfReader(io.BytesIO(archive.read(f"{request_id}.pdf")))
        text = "\n".join(page.extract_text() for page in pdf.pages)
        return text, json.loads(archive.read(f"{request_id}.json"))


async def wait_until_not_pending(api, headers, request_id, timeout=30.0):
    """Poll the request's status as a partner would: backing off to stay within the operation's
    rate limit (50 a minute), and waiting out a 429's Retry-After, until it is no longer pending."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + timeout, 0.1
    while loop.time() < deadline:
        status, response_headers, body = await api.call("GET", f"/v1/chart-retrieval/requests/{request_id}",
                                                        headers=headers)
        if status == 429:
            await asyncio.sleep(float(response_headers["Retry-After"]))
            continue
        assert status == 200, (status, body)
        if body["status"] != "pending":
            return body
        await asyncio.sleep(pause)  # the worker builds it
        pause = min(pause * 1.5, 1.5)
    pytest.fail("the chart was not built in time")


async def chart_schema_validator(api):
    """A validator of the chart JSON's schema as `GET /v1/schemas/chart.json` serves it (no token)."""
    import jsonschema
    response = await api.http.fetch(api.base_url + "/v1/schemas/chart.json", raise_error=False)
    assert response.code == 200 and response.headers["Content-Type"] == "application/schema+json", response.code
    schema = json.loads(response.body)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)
