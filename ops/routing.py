"""Routing shortcuts for `ObservedApplication`: the rule Tornado's in-order matching would pick,
found without trying every pattern before it (60 patterns; a FHIR read's was the 20th): a literal
path by lookup, any other by its first segment's rules, tried as one regex (`RuleTable`)."""
from __future__ import annotations

import re

import tornado.escape
import tornado.routing
import tornado.web

_REGEX_SPECIAL = frozenset(".^$*+?{}[]|()")
_NUMBERED = re.compile(r"\\\d|\(\?\(|\(\?P=|\(\?[aiLmsux-]")
"""What would change meaning inside a larger regex: a back-reference or a conditional (by group
number or name), or inline flags."""


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


def _path_arg(value: str | None) -> bytes | None:
    """A path argument as Tornado's `PathMatches` gives it: URL-unescaped bytes (None: an optional
    group that did not match); without a `%` there is nothing to unescape."""
    if value is None:
        return None
    if "%" in value:
        return tornado.escape.url_unescape(value, encoding=None, plus=False)
    return value.encode("utf-8")


class RuleTable:
    """Rules in Tornado's order, tried as one regex: an alternation of their patterns, each in a
    group of its own, whose first alternative to match is the rule Tornado's in-order matching
    picks (`find`). Patterns that one regex cannot hold unchanged (named or numbered
    back-references, named groups, flags) are tried one by one, as Tornado tries them."""

    __slots__ = ("rules", "_regex", "_alternatives")

    def __init__(self, rules: tuple):
        self.rules = rules
        self._regex, self._alternatives = None, {}
        regexes = [rule.matcher.regex for rule in rules]
        if not rules or any(regex.groupindex or regex.flags != re.UNICODE or _NUMBERED.search(regex.pattern)
                            for regex in regexes):
            return
        parts, group = [], 1
        for index, (rule, regex) in enumerate(zip(rules, regexes)):
            parts.append(f"(?P<_{index}>{regex.pattern})")
            self._alternatives[f"_{index}"] = (rule, group, group + regex.groups)
            group += 1 + regex.groups
        self._regex = re.compile("|".join(parts))

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def one_regex(self) -> bool:
        """Whether the rules are tried as one regex (else one by one)."""
        return self._regex is not None

    def find(self, request) -> tuple | None:
        """(rule, path args, path kwargs) of the rule matching `request`'s path, else None."""
        if self._regex is None:
            for rule in self.rules:
                params = rule.matcher.match(request)
                if params is not None:
                    return rule, params.get("path_args"), params.get("path_kwargs")
            return None
        match = self._regex.match(request.path)
        if match is None:
            return None
        rule, first, end = self._alternatives[match.lastgroup]
        return rule, [_path_arg(value) for value in match.groups()[first:end]], None


def segment_routes(rules) -> dict | None:
    """{first segment: a `RuleTable` of the rules, in order, that may match a path with it}, and
    under None the rules whose first segment is not fixed (they may match any path, so every table
    has them in their place). None when a rule is not a path pattern served by a RequestHandler
    (Tornado then routes every request)."""
    for rule in rules:
        target = rule.target
        if not isinstance(rule.matcher, tornado.routing.PathMatches) or not (
                isinstance(target, type) and issubclass(target, tornado.web.RequestHandler)):
            return None
    segments = [first_segment(rule.matcher.regex.pattern) for rule in rules]
    table: dict = {segment: RuleTable(tuple(rule for rule, own in zip(rules, segments) if own is None or own == segment))
                   for segment in set(segments) if segment is not None}
    table[None] = RuleTable(tuple(rule for rule, own in zip(rules, segments) if own is None))
    return table
