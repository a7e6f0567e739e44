"""Routing shortcuts for `ObservedApplication`: the rule Tornado's in-order matching would pick,
found without trying every pattern before it (60 patterns; a FHIR read's was the 20th)."""
from __future__ import annotations

import tornado.routing
import tornado.web

_REGEX_SPECIAL = frozenset(".^$*+?{}[]|()")


def _literal_prefix(pattern: str) -> tuple[str, str]:
    """(the literal text every match of `pattern` starts with, the rest of the pattern from its
    first regex syntax: '' when there is none). A quantifier's character is not literal."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            escaped = pattern[index + 1:index + 2]
            if not escaped or escaped.isalnum() or escaped == "_":
                break  # \d, \w, a trailing backslash...: a class, not a character
            out.append(escaped)
            index += 2
            continue
        if char in _REGEX_SPECIAL:
            break
        out.append(char)
        index += 1
    rest = pattern[index:]
    if rest[:1] in ("*", "+", "?", "{") and out:
        out.pop()  # `s?`: the character may be absent
    return "".join(out), rest


def literal_path(pattern: str) -> str | None:
    """The one path a route pattern matches when it has no regex syntax (`/healthz$`,
    `/\\.well-known/jwks\\.json$`), else None."""
    text, rest = _literal_prefix(pattern)
    return text if rest == "$" else None


def exact_routes(rules) -> dict:
    """{path: rule} for the rules whose pattern is one literal path that no earlier rule also
    matches, so looking the path up gives the rule Tornado's in-order matching would pick.
    Stops at the first rule that is not a plain path pattern (its matches are unknown)."""
    table: dict = {}
    earlier = []
    for rule in rules:
        if not isinstance(rule.matcher, tornado.routing.PathMatches):
            break
        path = literal_path(rule.matcher.regex.pattern)
        if path is not None and path not in table and not any(regex.match(path) for regex in earlier):
            table[path] = rule
        earlier.append(rule.matcher.regex)
    return table


def first_segment(pattern: str) -> str | None:
    """The literal first segment of every path a route regex matches (`fhir` for
    `/fhir/r4/([^/]+)$`, `healthz` for `/healthz$`), or None when it is not fixed."""
    text, rest = _literal_prefix(pattern)
    if not text.startswith("/"):
        return None
    segment, slash, _ = text[1:].partition("/")
    return (segment or None) if slash or rest == "$" else None


def segment_routes(rules) -> dict | None:
    """{first segment: the rules, in order, that may match a path with it}, and under None the
    rules whose first segment is not fixed (they may match any path, so every list has them in
    their place). None when a rule is not a path pattern served by a RequestHandler (Tornado then
    routes every request)."""
    for rule in rules:
        target = rule.target
        if not isinstance(rule.matcher, tornado.routing.PathMatches) or not (
                isinstance(target, type) and issubclass(target, tornado.web.RequestHandler)):
            return None
    segments = [first_segment(rule.matcher.regex.pattern) for rule in rules]
    table: dict = {segment: tuple(rule for rule, own in zip(rules, segments) if own is None or own == segment)
                   for segment in set(segments) if segment is not None}
    table[None] = tuple(rule for rule, own in zip(rules, segments) if own is None)
    return table
