"""Static checks of the code's shape: no import cycles, no async-unsafe handlers, no hidden globals.

The import graph is read from the source (AST), every `import` counted, including those inside
functions: a cycle deferred into a function body is still a cycle. An `importlib.import_module`
or `__import__` call counts as an import of every project module its name may start with.

Module state is checked the same way: no module binds a mutable container (list, dict, set,
their comprehensions and constructors) at its top level, and no function rebinds a module name
(`global`). Process state belongs to the runtime; constants are tuples, frozensets or
read-only mappings.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name not in ("tests",))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    modules["server"] = ROOT / "server.py"
    return modules


def imports_of(name: str, path: Path, modules: dict) -> set[str]:
    """Project modules `name` imports (resolving `from package import module` to the module)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    # A script's `if __name__ == "__main__":` block runs as module `__main__`, never as `name`.
    tree.body = [n for n in tree.body if not (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))]
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        targets += dynamic_import_targets(node, modules)
        for target in targets:
            while target and target not in modules:  # `a.b.c` where only `a.b` is a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def dynamic_import_targets(node, modules: dict) -> list[str]:
    """The project modules an `importlib.import_module(...)` / `__import__(...)` call may load:
    those named by its argument's constant text (an f-string's leading text is a prefix)."""
    if not isinstance(node, ast.Call) or not node.args:
        return []
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__"):
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
        return [name for name in modules if name.startswith(prefix)]
    return list(modules)  # a name computed some other way could be any module


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert "runtime" in graph and "workers.broker" in graph["runtime"]  # the graph sees lazy imports too
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_packages_import_each_other_without_cycle():
    packages: dict[str, set[str]] = {}
    for name, deps in import_graph().items():
        top = name.split(".")[0]
        packages.setdefault(top, set()).update(d.split(".")[0] for d in deps if d.split(".")[0] != top)
    cycle = find_cycle(packages)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_dynamic_import_is_an_edge_of_the_graph():
    modules = {"pkg": None, "pkg.one": None, "pkg.two": None, "other": None}
    tree = ast.parse("import importlib\ndef load(n):\n    return importlib.import_module(f'pkg.{n}')")
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert set(dynamic_import_targets(call, modules)) == {"pkg.one", "pkg.two"}
    assert dynamic_import_targets(ast.parse("__import__('other')").body[0].value, modules) == ["other"]


MUTABLE_CONSTRUCTORS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray",
                        "WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "Lock", "RLock", "local"}


def module_state(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for every top-level binding of a mutable container and every `global`."""
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if value is None:
            continue
        called = None
        if isinstance(value, ast.Call):
            func = value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) \
                or called in MUTABLE_CONSTRUCTORS:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            found.append((node.lineno, f"{ast.unparse(target)} = {type(value).__name__} {called or ''}".strip()))
    found += [(node.lineno, "global " + ", ".join(node.names)) for node in ast.walk(tree) if isinstance(node, ast.Global)]
    return found


def test_no_module_holds_mutable_state():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {what}" for name, path in project_modules().items()
                 for line, what in module_state(ast.parse(path.read_text()))]
    assert offenders == [], "module-level mutable state (give it to the runtime, or make it a constant):\n" + \
        "\n".join(offenders)


def test_the_module_state_check_sees_registries_and_globals():
    source = "_checks: dict = {}\nSOURCES = []\nSEEN = set()\nNAMES = ('a',)\nLIMITS = frozenset()\n" \
             "_lock = threading.Lock()\ndef f():\n    global _m\n    _m = 1\n"
    assert [line for line, _ in module_state(ast.parse(source))] == [1, 2, 3, 6, 8]


def test_conf_holds_settings_only():
    assert not any(name.startswith("conf.") and name not in ("conf.logging",) for name in project_modules()), \
        "conf/ holds settings only"
    assert not (import_graph()["conf"] - {"conf.logging"})


def test_every_handler_method_is_async():
    plain = [f"{path.relative_to(ROOT)}:{n}" for path in (ROOT / "handlers").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.match(r"^\s+def (get|post|put|patch|delete|prepare)\(self", line)
             and "handlers/base.py" not in str(path)]
    assert plain == []


def test_no_module_global_runtime_database_clock_or_broker():
    text = {name: path.read_text() for name, path in project_modules().items()}
    offenders = [name for name, source in text.items()
                 if re.search(r"^(_current|database|clock|_installed)\s*[:=]", source, re.M)
                 or "DatabaseProxy(" in source or "current_runtime" in source]
    assert offenders == []


def test_no_private_names_of_peewee():
    pattern = re.compile(r"_get_cursor_wrapper|\.__dict__\.update|\" VALUES \"")
    assert [name for name, path in project_modules().items() if pattern.search(path.read_text())] == []


DOMAIN_PACKAGES = ("errors", "models", "oauth", "lifecycle", "partner_api", "workers", "connectors", "storage", "keys", "fhir_api",
                   "ratelimit", "app_cache", "runtime", "billing", "console", "hub")


def test_the_domain_never_serves_http():
    """Only server.py, handlers/, ops/, cli/ and examples/ speak HTTP or bind sockets."""
    offenders = [name for name, path in project_modules().items() if name.split(".")[0] in DOMAIN_PACKAGES
                 and re.search(r"^\s*(import tornado|from tornado)|bind_sockets|\.listen\(|\.bind\(\(", path.read_text(), re.M)]
    assert offenders == []


def test_no_test_module_imports_another():
    """Shared test code lives in the tests/helpers/ package, so each test module can be read, run
    and changed alone."""
    offenders = []
    for path in [*(ROOT / "tests").glob("*.py"), *(ROOT / "tests" / "helpers").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name} imports {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert offenders == []



def test_one_gate_reads_bearer_tokens_and_writes_their_challenge():
    """Only oauth/bearer.py takes a token out of `Authorization: Bearer`, writes a
    `WWW-Authenticate: Bearer` challenge, or verifies an access token for a resource (oauth/tokens.py
    defines `verify`; revocation verifies the token parameter RFC 7009 names, not a bearer)."""
    gate, allowed_verify = "oauth.bearer", {"oauth.bearer", "oauth.tokens", "oauth.revocation"}
    offenders = []
    for name, path in project_modules().items():
        source = path.read_text()
        if name != gate and (re.search(r"""["']Bearer (realm|error)""", source)
                             or re.search(r"^\s*def bearer_value\(", source, re.M)):
            offenders.append(f"{name}: builds a Bearer challenge or reads a bearer token")
        if name not in allowed_verify and re.search(r"tokens\.verify\(", source):
            offenders.append(f"{name}: verifies an access token outside the gate")
    assert offenders == [], "\n".join(offenders)


def test_one_grammar_for_ids():
    """models/ids.py holds the only id grammar (`ID`, `is_id`): no other module compiles an id pattern
    (RESOURCE_ID, PATH_ID, PATIENT_ID, FHIR_ID... were four grammars that disagreed)."""
    # (private parsers of a structure, `_CHART_ID`, or of a header, `_SANE_REQUEST_ID`, are not id grammars)
    pattern = re.compile(r"^[A-Z][A-Z_]*ID\s*(:[^=]*)?=\s*re\.compile", re.M)
    offenders = [name for name, path in project_modules().items()
                 if name != "models.ids" and pattern.search(path.read_text())]
    assert offenders == []


# An id's character class: only letters, digits, `_`, `.`, `-` (any order, escaped or not; `\w`
# and `\d` count), holding letters and digits, repeated {1,64}. An NPI: ten digits. A resource
# type: a capital, then a class of letters of both cases (`[A-Za-z]`, `[a-zA-Z]`), repeated
# (`+`, `*`, `{1,63}`); a capitalised word (`[A-Z][a-z]+`) is not one. A FHIR date: a year of four
# digits, then an optional `-month` (`(\d{4})(?:-...`); a fixed day (`\d{4}-\d{2}-\d{2}`) is not one.
_ID_CLASS = re.compile(r"\[((?:A-Z|a-z|0-9|\\[wd.\-]|[_.\-])+)\]\{1,64\}")
_NPI_GRAMMAR = re.compile(r"(?:\\d|\[0-9\]|\[\\d\])\{10\}")
_RESOURCE_TYPE_GRAMMAR = re.compile(r"\[A-Z\]\[(?:A-Za-z|a-zA-Z)\](?:[+*]|\{)")
_FHIR_DATE_GRAMMAR = re.compile(r"(?:\\d|\[0-9\])\{4\}\)?\(\?:-")
NPI_SYSTEM_URI = "hl7.org/fhir/sid/us-npi"
GRAMMAR_HOMES = MappingProxyType({"an id grammar": "models.ids", "an NPI grammar": "models.npi",
                                  "the NPI system URI": "models.npi", "a resource type grammar": "models.fhir_grammar",
                                  "a FHIR date grammar": "models.fhir_grammar"})


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions (text, not patterns)."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _is_id_class(members: str) -> bool:
    """Does a character class of letters, digits, `_`, `.`, `-` hold both letters and digits?"""
    tokens = set(re.findall(r"A-Z|a-z|0-9|\\[wd.\-]|[_.\-]", members))
    return ({"A-Z", "a-z"} <= tokens or "\\w" in tokens) and bool({"0-9", "\\d", "\\w"} & tokens)


def grammar_literals(source: str) -> list[tuple[int, str]]:
    """(line, what) for every string literal that spells an id, NPI, resource type or FHIR date
    grammar or the NPI system URI, wherever it stands (a constant, a dict, a call's argument, a route, an f-string's
    text); docstrings aside."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        if any(_is_id_class(m[1]) for m in _ID_CLASS.finditer(node.value)):
            found.append((node.lineno, "an id grammar"))
        if _NPI_GRAMMAR.search(node.value):
            found.append((node.lineno, "an NPI grammar"))
        if NPI_SYSTEM_URI in node.value:
            found.append((node.lineno, "the NPI system URI"))
        if _RESOURCE_TYPE_GRAMMAR.search(node.value):
            found.append((node.lineno, "a resource type grammar"))
        if _FHIR_DATE_GRAMMAR.search(node.value):
            found.append((node.lineno, "a FHIR date grammar"))
    return sorted(found)


def test_the_id_npi_resource_type_and_date_grammars_are_spelled_in_their_homes_only():
    """models/ids.py holds the id grammar, models/npi.py the NPI grammar and system URI,
    models/fhir_grammar.py the resource type and FHIR date grammars: every other module imports them
    (a copy of the id pattern in the OpenAPI document admitted `.` and `..`; an NPI or date spelled
    with `\\d` took Arabic-Indic digits; the FHIR API's route took a type of any length), wherever
    the copy stands."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {what} outside {GRAMMAR_HOMES[what]}"
                 for name, path in project_modules().items()
                 for line, what in grammar_literals(path.read_text()) if name != GRAMMAR_HOMES[what]]
    assert offenders == [], "\n".join(offenders)


GRAMMAR_PROBE = r'''"""A docstring may quote [A-Za-z0-9_.-]{1,64} and \d{10}."""
SCHEMA = {"id": {"pattern": "^[A-Za-z0-9_.\\-]{1,64}$"}}
ok = re.fullmatch(r"[\w.-]{1,64}", value)
NPI = re.compile(r"^\d{10}$")
def f(n):
    return re.fullmatch(r"[0-9]{10}", n) or f"{n}|" + "http://hl7.org/fhir/sid/us-npi"
PATTERN = rf"Patient/([A-Za-z0-9\-.]{{1,64}})"
ROUTES = [(rf"{base}/([A-Z][A-Za-z]+)/([^/]+)", ReadHandler)]
_SCOPE = re.compile(r"^(patient|user|system)/(\*|[A-Z][a-zA-Z]{1,63})\.(read|write)$")
_DATE = re.compile(r"^(eq|ge)?(\d{4})(?:-(\d{2}))?$|[0-9]{4}(?:-[0-9]{2})?")
NOT_ONE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$|[a-z0-9_-]{1,64}|[A-Za-z0-9_-]{1,100}|\d{1,10}|[A-Z][a-z]+|[A-Z]{2}"
                     r"|^\d{4}-\d{2}-\d{2}$|^\d{4}-(0[1-9]|1[0-2])$")
'''


def test_the_grammar_check_sees_a_copy_wherever_it_stands():
    assert grammar_literals(GRAMMAR_PROBE) == [(2, "an id grammar"), (3, "an id grammar"), (4, "an NPI grammar"),
                                               (6, "an NPI grammar"), (6, "the NPI system URI"), (7, "an id grammar"),
                                               (8, "a resource type grammar"), (9, "a resource type grammar"),
                                               (10, "a FHIR date grammar")]


def test_endpoint_urls_are_built_in_discovery_only():
    """`oauth.discovery.endpoints` is the one builder of the authorization server's endpoint URLs that
    the service advertises (the discovery documents, SMART's configuration, the CapabilityStatement).
    Routes (handlers/), clients (examples/, bench/) and the OpenAPI document's paths are not builders."""
    pattern = re.compile(r"""f["'][^"']*\}/(v1|os-api/v2)?/?oauth/(authorize|token|userinfo|introspect|revoke)""")
    offenders = [name for name, path in project_modules().items()
                 if name.split(".")[0] in DOMAIN_PACKAGES and name not in ("oauth.discovery", "partner_api.openapi")
                 and pattern.search(path.read_text())]
    assert offenders == []


def conftest_imports(path: Path) -> list[str]:
    """`path`'s imports of conftest (`import conftest`, `from conftest import`, `tests.conftest`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[-1] == "conftest"]
    return found


def test_no_test_module_imports_conftest():
    """conftest.py holds fixtures only; the helpers tests share are the tests/helpers/ package's.
    A module that still says `from conftest import X` imports X from its `helpers` module instead."""
    offenders = [hit for path in sorted((ROOT / "tests").rglob("*.py")) if "node_modules" not in path.parts
                 for hit in conftest_imports(path)]
    assert offenders == [], "import these from helpers, not conftest: " + "; ".join(offenders)


def test_the_conftest_import_check_sees_every_spelling(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import conftest\nfrom conftest import World\nfrom tests.conftest import free_port\n"
                     "def f():\n    from conftest import ROOT\nfrom helpers.worlds import World\n")
    assert len(conftest_imports(probe)) == 4


def test_conftest_holds_fixtures_only_and_helpers_none():
    """Fixtures are conftest.py's (pytest finds them there); everything else it needs it imports."""
    def is_fixture(node) -> bool:
        return any("fixture" in ast.unparse(d) for d in node.decorator_list)

    conftest = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    helpers = [ast.parse(path.read_text()) for path in sorted((ROOT / "tests" / "helpers").glob("*.py"))]
    defined = [n for n in conftest.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert [n.name for n in defined if isinstance(n, ast.ClassDef) or not is_fixture(n)] == []
    assert [ast.unparse(n) for n in conftest.body if isinstance(n, (ast.Assign, ast.AnnAssign))] == []
    assert [n.name for tree in helpers for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and is_fixture(n)] == []


# -- the tests' own layout: helpers in tests/helpers/, each fixture defined once ------------------------

TESTS = ROOT / "tests"


def stray_test_modules(tests: Path) -> list[str]:
    """Python files at the top of `tests` that are neither conftest.py nor a test module."""
    return sorted(p.name for p in tests.glob("*.py") if p.name != "conftest.py" and not p.name.startswith("test_"))


def fixture_name(node) -> str | None:
    """The name pytest knows a function by if it is a fixture (its `name=` or its own), else None."""
    for decorator in node.decorator_list:
        called = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(called).rpartition(".")[2] == "fixture":  # pytest.fixture, fixture(scope=...)
            named = [k.value.value for k in getattr(decorator, "keywords", ()) if k.arg == "name"]
            return named[0] if named else node.name
    return None


def parametrized(node) -> set[str]:
    """The argument names a function's `parametrize` decorators give (they are not fixtures)."""
    names = set()
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and "parametrize" in ast.unparse(decorator.func) and decorator.args:
            first = decorator.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names |= {n.strip() for n in first.value.split(",")}
    return names


def fixtures_and_uses(tests: Path) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Which modules under `tests` define each fixture, and which request it: as an argument of a
    test or of a fixture (a parametrized one aside), or by `usefixtures` / `getfixturevalue`."""
    defined, used = {}, {}
    for path in sorted(p for p in tests.rglob("*.py") if "node_modules" not in p.parts):
        module, text = path.relative_to(tests).as_posix(), path.read_text()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            name = fixture_name(node)
            if name:
                defined.setdefault(name, []).append(module)
            if name or node.name.startswith("test"):
                arguments = {a.arg for a in node.args.args + node.args.kwonlyargs} - parametrized(node)
                for argument in arguments:
                    used.setdefault(argument, set()).add(module)
        requested = re.findall(r"""getfixturevalue\(\s*["'](\w+)""", text)
        requested += [n for call in re.findall(r"usefixtures\(([^)]*)\)", text) for n in re.findall(r"""["'](\w+)["']""", call)]
        for name in requested:
            used.setdefault(name, set()).add(module)
    return defined, used


def defined_twice(defined: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: modules for name, modules in defined.items() if len(modules) > 1}


def borrowed(defined: dict[str, list[str]], used: dict[str, set[str]]) -> dict[str, list[str]]:
    """Fixtures a test module defines that other modules request: (name: those modules)."""
    return {name: sorted(used.get(name, set()) - {module}) for name, modules in defined.items() for module in modules
            if module.startswith("test_") and used.get(name, set()) - {module}}


def test_the_top_of_tests_holds_conftest_and_test_modules_only():
    """Code the tests share lives in the tests/helpers/ package, in a module named by what it helps
    with; tests/ itself holds conftest.py, test_*.py, fixtures/ (data) and js/ (the npm side)."""
    assert stray_test_modules(TESTS) == [], "move these into tests/helpers/"


def test_every_fixture_is_defined_once():
    """One definition per fixture name, so a name means one thing: a module needing something else
    names it for what it is (`fhir_user_world`, not a second `smart_world`), and a module adjusting
    the service's settings says so with `@pytest.mark.svc_settings(...)`, not a second `settings`."""
    defined, _ = fixtures_and_uses(TESTS)
    assert defined_twice(defined) == {}


def test_a_fixture_of_a_test_module_is_that_modules_only():
    """A fixture more than one module uses is conftest.py's."""
    assert borrowed(*fixtures_and_uses(TESTS)) == {}, "move these fixtures into conftest.py"


def test_the_layout_checks_see_a_stray_module_a_second_definition_and_a_borrowed_fixture(tmp_path):
    (tmp_path / "conftest.py").write_text("import pytest\n@pytest.fixture\ndef world():\n    return 1\n")
    (tmp_path / "rest_helpers.py").write_text("def partner_headers():\n    return {}\n")
    (tmp_path / "test_a.py").write_text(
        "import pytest\n@pytest.fixture\ndef world():\n    return 2\n@pytest.fixture(name='clinic')\n"
        "def make_clinic():\n    return 3\ndef test_one(world, clinic):\n    pass\n")
    (tmp_path / "test_b.py").write_text(
        "import pytest\n@pytest.mark.parametrize('flag, clinic', [(1, 2)])\ndef test_two(flag, clinic):\n    pass\n"
        "@pytest.mark.usefixtures('world')\ndef test_three(request):\n    request.getfixturevalue('clinic')\n")
    assert stray_test_modules(tmp_path) == ["rest_helpers.py"]
    defined, used = fixtures_and_uses(tmp_path)
    assert defined == {"world": ["conftest.py", "test_a.py"], "clinic": ["test_a.py"]}
    assert defined_twice(defined) == {"world": ["conftest.py", "test_a.py"]}
    assert borrowed(defined, used) == {"world": ["test_b.py"], "clinic": ["test_b.py"]}


def test_every_connector_declares_the_interfaces_capabilities():
    """`connectors.base.Connector`'s flags are declared by each connector itself (no `getattr`
    default standing in for a forgotten one), and one that reads on the IOLoop has `read_later`."""
    import typing

    from connectors import CONNECTORS
    from connectors.base import Connector
    flags = [name for name, value in vars(Connector).items() if isinstance(value, bool) and not name.startswith("_")]
    assert sorted(flags) == ["answers_matched", "reads_on_loop"]
    for name, connect in CONNECTORS.items():
        kind = typing.get_type_hints(connect)["return"]
        declared = {flag for klass in kind.__mro__[:-1] for flag in flags if flag in vars(klass)}
        assert declared == set(flags), (name, kind)
        assert not kind.reads_on_loop or callable(getattr(kind, "read_later", None)), name
