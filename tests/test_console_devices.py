"""Console device cookies over real HTTP (both database backends): a stranger spraying wrong
passwords locks the account and the address for untrusted browsers only; the developer's browser,
holding the device cookie its last sign-in gave it, still signs in with the right password, and its
own wrong passwords lock only it (`console.devices`; OWASP, "Slow Down Online Guessing Attacks with
Device Cookies")."""
from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import re

import pyotp
import pytest

from helpers.console import PASSWORD, ConsoleClient, developer, invite_path
from helpers.processes import free_port
from models.audit import AuditEvent

DEVICE = "svc_console_device"
EMAIL = "dev@partner.example"
LEGIT = "198.51.100.7"      # the developer's address (and a stranger's behind the same NAT)
ATTACKER = "203.0.113.9"
WRONG = "wrong password!"


def trust_local_proxy(runtime):
    """The test client connects from 127.0.0.1; let it speak for other addresses through XFF."""
    runtime.settings = runtime.settings.replace(trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),))


def device_set_cookie(response) -> str:
    """The Set-Cookie header of the device cookie in `response` ('' when there is none)."""
    return next((h for h in response.headers.get_list("Set-Cookie") if h.startswith(DEVICE + "=")), "")


async def sign_out(client: ConsoleClient):
    """Sign out from the home page's form, as a developer does."""
    assert (await client.get("/console")).code == 200, client.last_html
    return await client.post("/console/logout")


async def spray(http_client, base_url, runtime, email: str, address: str) -> ConsoleClient:
    """A stranger without a device cookie tries wrong passwords for `email` from `address` until the
    account is locked (429); returns their client."""
    attacker = ConsoleClient(http_client, base_url, address)
    for _ in range(runtime.console_signin_policy().subject.count):
        assert (await attacker.sign_in(email, WRONG)).code == 401, attacker.last_html
    assert (await attacker.sign_in(email, WRONG)).code == 429
    return attacker


def lockouts(subject_prefix: str) -> list[AuditEvent]:
    return list(AuditEvent.select().where((AuditEvent.action == "auth.lockout")
                                          & AuditEvent.subject.startswith(subject_prefix)))


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.svc_settings(redis=True))])
@pytest.mark.gen_test(timeout=90)
async def test_a_spray_of_wrong_passwords_does_not_lock_the_developer_out_of_their_own_browser(
        http_client, base_url, runtime, world, store):
    """Before device cookies a locked account refused even the right password from everywhere:
    anyone who knew a developer's e-mail could keep them out of the console indefinitely."""
    trust_local_proxy(runtime)
    browser = await developer(http_client, base_url, runtime, world.app.id, EMAIL, address=LEGIT)
    first_device = browser.cookies.get(DEVICE)  # (read without a KeyError: before device cookies, none)
    assert (await sign_out(browser)).code == 303
    assert "svc_console" not in browser.cookies and browser.cookies.get(DEVICE) == first_device  # kept
    attacker = await spray(http_client, base_url, runtime, EMAIL, ATTACKER)
    assert lockouts("account:"), "the account's lock is audited as before"
    # The right password without the cookie is refused while the lock lasts, whoever sends it.
    assert (await attacker.sign_in(EMAIL, PASSWORD)).code == 429
    new_browser = ConsoleClient(http_client, base_url, LEGIT)
    refused = await new_browser.sign_in(EMAIL, PASSWORD)
    assert refused.code == 429 and int(refused.headers["Retry-After"]) >= 1 and DEVICE not in new_browser.cookies
    # A stranger behind the developer's NAT locks its address too, trying other accounts.
    neighbour = ConsoleClient(http_client, base_url, LEGIT)
    for n in range(runtime.console_signin_policy().address.count):  # the 429s above were not counted
        assert (await neighbour.sign_in(f"someone{n}@else.example", WRONG)).code == 401
    assert (await neighbour.sign_in("another@else.example", WRONG)).code == 429
    # The developer's browser, with its device cookie and the right password, signs in.
    signed_in = await browser.sign_in(EMAIL, PASSWORD)
    assert signed_in.code == 303 and signed_in.headers["Location"] == "/console", browser.last_html
    assert (await browser.get("/console")).code == 200 and EMAIL in browser.last_html
    assert first_device and browser.cookies[DEVICE] != first_device  # each sign-in gives a new one
    # Its wrong passwords are counted against it alone: the next one is a 401, not a 429.
    assert (await sign_out(browser)).code == 303
    assert (await browser.sign_in(EMAIL, WRONG)).code == 401
    assert (await attacker.sign_in(EMAIL, PASSWORD)).code == 429  # the account stays locked to others


@pytest.mark.gen_test(timeout=90)
async def test_a_trusted_device_is_locked_by_its_own_failures_alone(http_client, base_url, runtime, world):
    trust_local_proxy(runtime)
    limit = runtime.console_signin_policy().subject
    laptop = await developer(http_client, base_url, runtime, world.app.id, EMAIL, address=LEGIT)
    desktop = ConsoleClient(http_client, base_url, LEGIT)
    assert (await desktop.sign_in(EMAIL, PASSWORD)).code == 303 and DEVICE in desktop.cookies
    await sign_out(desktop)
    await sign_out(laptop)
    nonce = laptop.cookies[DEVICE].split(".")[2]
    for _ in range(limit.count):
        assert (await laptop.sign_in(EMAIL, WRONG)).code == 401
    refused = await laptop.sign_in(EMAIL, PASSWORD)  # even the right password, from this device
    refused_at = runtime.clock.time()
    assert refused.code == 429 and "Too many failed sign-ins" in laptop.last_html
    wait = int(refused.headers["Retry-After"])
    assert limit.seconds - 60 <= wait <= limit.seconds
    # Audited like every lock, the device named by a hash: no nonce, no e-mail.
    [event] = lockouts("device:")
    assert event.detail["throttle"] == "console_signin" and event.detail["locked"][0] == "device"
    assert event.detail["address"] == LEGIT
    text = json.dumps([event.actor, event.subject, event.detail])
    assert nonce not in text and EMAIL not in text
    # Its failures count for the account too: a browser without a cookie is refused (the account's
    # lock, as CONTRACTS.md's console throttle says), the other trusted device is not.
    assert lockouts("account:")
    assert (await ConsoleClient(http_client, base_url, LEGIT).sign_in(EMAIL, PASSWORD)).code == 429
    assert (await desktop.sign_in(EMAIL, PASSWORD)).code == 303
    assert (await laptop.sign_in(EMAIL, PASSWORD)).code == 429  # still locked
    runtime.clock.advance(refused_at + wait - runtime.clock.time())  # when Retry-After said: the laptop signs in
    assert (await laptop.sign_in(EMAIL, PASSWORD)).code == 303, laptop.last_html


@pytest.mark.gen_test(timeout=90)
@pytest.mark.svc_settings(console_device_cookie_lifetime=600)
async def test_another_accounts_forged_tampered_or_expired_device_cookie_is_ignored(
        http_client, base_url, runtime, world):
    trust_local_proxy(runtime)
    other = await developer(http_client, base_url, runtime, world.app.id, "other@partner.example", address=LEGIT)
    browser = await developer(http_client, base_url, runtime, world.app.id, EMAIL, address=LEGIT)
    mine, others = browser.cookies[DEVICE], other.cookies[DEVICE]
    await sign_out(browser)
    runtime.clock.advance(500)  # 100 s of the cookies' lifetime (600 s here) left
    await spray(http_client, base_url, runtime, EMAIL, ATTACKER)
    version, issued, nonce, mac = mine.split(".")

    def tampered(text: str) -> str:
        """`text` with its first character changed (flipped by the other's first character, the
        nonce was left as it was once in 64 runs)."""
        return ("B" if text[0] == "A" else "A") + text[1:]
    presented = {
        "another account's": others,
        "a tampered MAC": ".".join((version, issued, nonce, tampered(mac))),
        "a tampered nonce": ".".join((version, issued, tampered(nonce), mac)),
        "a later issue time": ".".join((version, str(int(issued) + 500), nonce, mac)),
        "a forged one": f"v1.{int(runtime.clock.time())}.{'A' * 43}.{'B' * 43}",
        "junk": "v1.99999999999999." + "x" * 500,
        "non-ASCII": "v1.\u00e9",
    }
    for what, value in presented.items():
        client = ConsoleClient(http_client, base_url, LEGIT)
        client.cookies[DEVICE] = value
        assert (await client.sign_in(EMAIL, PASSWORD)).code == 429, what  # the untrusted path: locked
    # The genuine cookie of this account, within its lifetime, is trusted (and replaced).
    assert (await browser.sign_in(EMAIL, PASSWORD)).code == 303, browser.last_html
    newer = browser.cookies[DEVICE]
    await sign_out(browser)
    runtime.clock.advance(100)  # `mine` is now SVC_CONSOLE_DEVICE_COOKIE_LIFETIME old; the lock is still on
    expired = ConsoleClient(http_client, base_url, LEGIT)
    expired.cookies[DEVICE] = mine
    assert (await expired.sign_in(EMAIL, PASSWORD)).code == 429
    assert browser.cookies[DEVICE] == newer and (await browser.sign_in(EMAIL, PASSWORD)).code == 303


@pytest.mark.gen_test(timeout=90)
async def test_a_cookie_of_the_same_name_a_sibling_host_plants_does_not_hide_the_genuine_one(
        http_client, base_url, runtime, world):
    """A host under the same parent domain (security.md's threat for the `_xsrf` cookie) can set
    `svc_console_device` for the parent domain, Path=/console: the browser then sends both, the planted
    one last when it was set later. The handler read one value per name, the last, so the developer's
    browser was untrusted again and a stranger's spray locked them out of it, as before device cookies."""
    trust_local_proxy(runtime)
    attackers_own = await developer(http_client, base_url, runtime, world.app.id, "other@partner.example",
                                     address=ATTACKER)  # a valid device cookie, of the attacker's account
    browser = await developer(http_client, base_url, runtime, world.app.id, EMAIL, address=LEGIT)
    await sign_out(browser)
    await spray(http_client, base_url, runtime, EMAIL, ATTACKER)
    forged = f"v1.{int(runtime.clock.time())}.{'A' * 43}.{'B' * 43}"
    for planted in (attackers_own.cookies[DEVICE], forged, "junk"):
        browser.planted = [(DEVICE, planted)]
        signed_in = await browser.sign_in(EMAIL, PASSWORD)
        assert signed_in.code == 303, (planted, browser.last_html)
        await sign_out(browser)
    # Planted ones alone are the untrusted path still: the account stays locked to them.
    stranger = ConsoleClient(http_client, base_url, LEGIT)
    stranger.planted = [(DEVICE, attackers_own.cookies[DEVICE]), (DEVICE, forged)]
    assert (await stranger.sign_in(EMAIL, PASSWORD)).code == 429


@pytest.mark.gen_test(timeout=90)
async def test_the_device_cookie_signs_nobody_in_and_the_second_factor_still_applies(
        http_client, base_url, runtime, world):
    client = ConsoleClient(http_client, base_url)
    path = invite_path(runtime, world.app.id, "otp@partner.example")
    await client.get(path)
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', client.last_html).group(1)
    code = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.post(path, {"password": PASSWORD, "confirm": PASSWORD, "totp_code": code})).code == 303
    runtime.clock.advance(30)
    fresh = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.sign_in("otp@partner.example", PASSWORD, fresh)).code == 303
    await sign_out(client)
    assert set(client.cookies) == {DEVICE}
    assert (await client.get("/console")).headers["Location"] == "/console/login"  # the cookie alone: no session
    assert (await client.sign_in("otp@partner.example", PASSWORD)).code == 401      # no code: refused
    assert (await client.sign_in("otp@partner.example", PASSWORD, fresh)).code == 401  # a spent code too
    assert (await client.sign_in("otp@partner.example", WRONG, fresh)).code == 401
    runtime.clock.advance(30)
    fresh = pyotp.TOTP(secret).at(runtime.clock.time())
    assert (await client.sign_in("otp@partner.example", PASSWORD, fresh)).code == 303


@pytest.mark.gen_test(timeout=60)
async def test_the_device_cookie_attributes(http_client, base_url, runtime, world):
    client = await developer(http_client, base_url, runtime, world.app.id, EMAIL)
    await sign_out(client)
    await client.get("/console/login")
    signed_in = await client.post("/console/login", {"email": EMAIL, "password": PASSWORD})
    assert signed_in.code == 303
    cookie = device_set_cookie(signed_in)
    attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}
    assert attributes.keys() >= {"path", "httponly", "samesite", "max-age"} and "secure" not in attributes
    assert attributes["path"] == "Path=/console" and attributes["samesite"] == "SameSite=Lax"
    assert attributes["max-age"] == f"Max-Age={runtime.settings.console_device_cookie_lifetime}" == "Max-Age=15552000"
    value = client.cookies[DEVICE]
    # A time, a nonce and a MAC (32 bytes each): no room for the e-mail, in clear or encoded.
    _, issued, nonce, mac = value.split(".")
    assert abs(int(issued) - runtime.clock.time()) < 60
    assert len(base64.urlsafe_b64decode(nonce + "=")) == len(base64.urlsafe_b64decode(mac + "=")) == 32
    out = await sign_out(client)  # signing out keeps it
    assert not device_set_cookie(out) and client.cookies[DEVICE] == value
    # Secure when the console is served over https, like the session cookie.
    runtime.settings = runtime.settings.replace(issuer="https://svc.example")
    await client.get("/console/login")
    secure = await client.post("/console/login", {"email": EMAIL, "password": PASSWORD})
    assert secure.code == 303 and "Secure" in device_set_cookie(secure).split("; ")



@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.svc_settings(redis=True))])
@pytest.mark.gen_test(timeout=90)
async def test_wrong_passwords_sent_together_get_no_more_tries_than_the_limit(
        http_client, base_url, runtime, world, store):
    """The throttle was checked before the password's hash and counted after it: every sign-in
    whose check ran while others were hashing passed, so one burst of 15 wrong passwords got 12
    answers (401) where the account allows 5 in 15 minutes."""
    trust_local_proxy(runtime)
    await developer(http_client, base_url, runtime, world.app.id, EMAIL, address=LEGIT)
    limit = runtime.console_signin_policy().subject
    attackers = [ConsoleClient(http_client, base_url, ATTACKER) for _ in range(3 * limit.count)]
    for attacker in attackers:
        assert (await attacker.get("/console/login")).code == 200
    answers = await asyncio.gather(*(attacker.post("/console/login", {"email": EMAIL, "password": WRONG})
                                     for attacker in attackers))
    assert sorted(answer.code for answer in answers) == [401] * limit.count + [429] * (2 * limit.count)
    # Only failures stay counted: right passwords sent together (new browsers, as many as the limit)
    # all sign in and leave nothing counted, so the account still has its 5 wrong ones after them.
    await developer(http_client, base_url, runtime, world.app.id, "other@partner.example", address=LEGIT)
    browsers = [ConsoleClient(http_client, base_url, LEGIT) for _ in range(limit.count)]
    for browser in browsers:
        assert (await browser.get("/console/login")).code == 200
    answers = await asyncio.gather(*(browser.post("/console/login", {"email": "other@partner.example",
                                                                      "password": PASSWORD}) for browser in browsers))
    assert [answer.code for answer in answers] == [303] * limit.count
    stranger = ConsoleClient(http_client, base_url, "192.0.2.1")
    assert [(await stranger.sign_in("other@partner.example", WRONG)).code for _ in range(limit.count + 1)] == \
        [401] * limit.count + [429]


@pytest.mark.gen_test(timeout=60)
async def test_sign_in_with_the_failure_counts_unreachable_is_a_503(http_client, base_url, runtime, world):
    """Redis unreachable: a sign-in can be neither checked against its counts nor counted, so it gets
    503 + Retry-After (a wrong password never an uncounted 401), from a trusted browser too."""
    from ratelimit.failures import build_failure_throttle
    browser = await developer(http_client, base_url, runtime, world.app.id, EMAIL)
    await sign_out(browser)
    settings = runtime.settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    runtime.console_signin_throttle = build_failure_throttle(settings, "console_signin", runtime.console_signin_policy(),
                                                             runtime.clock.time, runtime.hasher)
    for password in (WRONG, PASSWORD):
        for client in (browser, ConsoleClient(http_client, base_url)):
            answer = await client.sign_in(EMAIL, password)
            assert answer.code == 503 and int(answer.headers["Retry-After"]) >= 1, client.last_html
