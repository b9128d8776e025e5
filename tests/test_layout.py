"""The tree's rules, checked on the real import graph (grimp parses every module; imports inside functions and
`if TYPE_CHECKING:` imports count too): `platform_shims` is below everything, `indexing` is a library below
`pipeline` and `jobs`, `indexing/` and `pipeline/` are stacks of rooms (`INDEXING_ROOMS`, `LAYERS`) that import
only downward, and no two modules of the project import each other in a cycle, not even to name a type (a module
that needs the type of one importing it names a Protocol of its own, as retrievers.py's `IndexVersion`). A failure
names each offending import by file and line."""

import ast
import subprocess
from pathlib import Path

import grimp
import networkx as nx
import pytest

PACKAGES = ("platform_shims", "indexing", "pipeline", "jobs")
ROOT = Path(__file__).resolve().parent.parent

# pipeline/'s layers, lowest first (README "Layout" lists them top down): a module of one may import its own
# layer and those below it, never one above; a layer is a subpackage, or config.py or errors.py
LAYERS = (
    "errors",
    "text",
    "assets",
    "config",
    "engine",
    "io",
    "classifier",
    "backends",
    "methods",
    "runtime",
    "evaluation",
)

# indexing/'s rooms, lowest first, the same rule (README "Layout" lists them top down): a subpackage, or
# settings.py or errors.py; indexing/__init__.py, the library's front door, stands above them all
INDEXING_ROOMS = ("errors", "settings", "corpus", "versions", "shards", "search", "builder")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)


def edges(graph):
    return [(m, dep) for m in graph.modules for dep in graph.find_modules_directly_imported_by(m)]


def where(graph, importer: str, imported: str) -> str:
    """`file:line` of each place where `importer` imports `imported`."""
    parts = importer.split(".")
    module = Path(*parts).with_suffix(".py")
    file = module if (ROOT / module).is_file() else Path(*parts, "__init__.py")
    lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
    return ", ".join(f"{file}:{n}" for n in lines) or str(file)


def layer(module: str, package: str = "pipeline") -> str | None:
    """The room of `module` in `package`: `<package>.<room>[...]`; None outside it (and for its __init__)."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


def upward_imports(graph, package: str, rooms: tuple[str, ...]) -> list[str]:
    """Each import of one of `package`'s rooms from a higher one (`rooms` lowest first), as `file:line: ...`;
    a room that `rooms` does not name fails the check."""
    unknown, upward = set(), []
    for m, dep in edges(graph):
        a, b = layer(m, package), layer(dep, package)
        if a is None or b is None or a == b:
            continue
        unknown |= {x for x in (a, b) if x not in rooms}
        if a in rooms and b in rooms and rooms.index(b) > rooms.index(a):
            upward.append(f"{where(graph, m, dep)}: {a} imports {dep} ({b})")
    assert not unknown, f"rooms of {package}/ not in test_layout (place them there): {sorted(unknown)}"
    return sorted(upward)


def test_indexing_imports_neither_pipeline_nor_jobs(graph):
    bad = [
        (m, dep)
        for m, dep in edges(graph)
        if m.split(".")[0] == "indexing" and dep.split(".")[0] in ("pipeline", "jobs")
    ]
    assert not bad, f"indexing must not import pipeline or jobs: {bad}"


def test_pipeline_does_not_import_jobs(graph):
    bad = [(m, dep) for m, dep in edges(graph) if m.split(".")[0] == "pipeline" and dep.split(".")[0] == "jobs"]
    assert not bad, f"pipeline must not import jobs: {bad}"


def test_pipeline_imports_only_downward_between_its_layers(graph):
    upward = upward_imports(graph, "pipeline", LAYERS)
    assert not upward, "imports from a higher layer of pipeline/:\n" + "\n".join(upward)


def test_indexing_imports_only_downward_between_its_rooms(graph):
    upward = upward_imports(graph, "indexing", INDEXING_ROOMS)
    assert not upward, "imports from a higher room of indexing/:\n" + "\n".join(upward)


def test_platform_shims_import_nothing_of_the_project(graph):
    bad = [
        f"{where(graph, m, dep)} imports {dep}"
        for m, dep in edges(graph)
        if m.split(".")[0] == "platform_shims" and dep.split(".")[0] != "platform_shims"
    ]
    assert not bad, "platform_shims must import nothing of indexing, pipeline or jobs:\n" + "\n".join(sorted(bad))


def layout_rows() -> list[str]:
    """The place each row of README "Layout"'s table names (its first cell), in the table's order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Layout\n") :].split("\n## ", 2)[1]
    return [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]


@pytest.mark.parametrize(("package", "rooms"), [("pipeline", LAYERS), ("indexing", INDEXING_ROOMS)])
def test_the_readme_lists_the_rooms_top_down(package, rooms):
    """README "Layout" names each room on its own row, in the rooms' order from the top, so a reader sees the rule."""
    rows = [r for r in layout_rows() if r.startswith(package + "/")]
    named = [r.removeprefix(package + "/").removesuffix("/").removesuffix(".py") for r in rows]
    assert [n for n in named if n in rooms] == list(reversed(rooms)), named


def tree_places() -> set[str]:
    """What README "Layout" has a row for: each top-level folder of the repository's files, each subpackage of
    indexing/, pipeline/ and jobs/, and each module directly under indexing/ and pipeline/."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    places = {f.split("/")[0] + "/" for f in files if "/" in f}
    for package in ("indexing", "pipeline", "jobs"):
        places |= {f"{package}/{p.parent.name}/" for p in (ROOT / package).glob("*/__init__.py")}
    for package in ("indexing", "pipeline"):
        places |= {f"{package}/{p.name}" for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
    return places


def test_the_readme_layout_rows_match_the_tree():
    rows, places = layout_rows(), tree_places()
    assert len(rows) == len(set(rows)), f"a place with two rows: {sorted(r for r in rows if rows.count(r) > 1)}"
    missing, gone = sorted(places - set(rows)), sorted(set(rows) - places)
    assert not missing and not gone, f"README Layout: rows to add {missing}; rows for no such place {gone}"


def test_no_import_cycle_between_modules(graph):
    g = nx.DiGraph(edges(graph))
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    shown = [
        "; ".join(f"{where(graph, m, dep)} imports {dep}" for m in c for dep in c if g.has_edge(m, dep)) for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


# the packages whose rooms are entered by their front doors: a room (a package) is entered from outside it only
# through what its __init__ lists in `__all__`: the names it exports, and the modules it names public
FRONT_DOORS = ("platform_shims", "indexing", "pipeline")
# rooms whose every module is a door (none: each room names its doors in `__all__`)
DOORS_NOT_YET_NAMED: set[str] = set()


def doors(package: str) -> set[str] | None:
    """What `package`'s __init__ lists in `__all__` (a literal list or tuple); None where it has none."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def past_front_doors(graph) -> list[str]:
    """Each import that enters a room of FRONT_DOORS' packages from outside it other than by a door, as
    `file:line: ...`. An import of a.b.c.d from a.x enters a.b (whose __all__ must list c), then a.b.c (whose
    __all__ must list d); a room's own modules import each other freely."""
    bad = []
    for m, dep in edges(graph):
        a, b = m.split("."), dep.split(".")
        if b[0] not in FRONT_DOORS:
            continue
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        for depth in range(shared + 1, len(b)):  # the rooms entered on the way, outermost first
            room = ".".join(b[:depth])
            if room in DOORS_NOT_YET_NAMED:
                break
            named = doors(room)
            if named is None or b[depth] not in named:
                bad.append(f"{where(graph, m, dep)}: {m} imports {dep}, past {room}'s front door ({room}.__all__)")
                break
    return sorted(bad)


def test_rooms_are_entered_by_their_front_doors(graph):
    bad = past_front_doors(graph)
    assert not bad, (
        "imports past a room's front door (import what it exports, or name the module in its __all__):\n"
        + "\n".join(bad)
    )


def room_of(module: str, is_package: bool) -> str:
    """The room a module stands in: the package that holds it (a package's __init__: that package)."""
    return module if is_package else module.rpartition(".")[0]


def underscore_imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Each `from X import _name` in the packages' code where X stands in another room than the importer (a
    room's underscore names are its own), as `file:line: ...`."""
    bad = []
    for path in sorted(p for package in packages for p in (root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module.split(".")[0] not in packages:
                continue
            private = [n.name for n in node.names if n.name.startswith("_") and not n.name.startswith("__")]
            theirs = room_of(node.module, root.joinpath(*node.module.split("."), "__init__.py").is_file())
            if private and theirs != room_of(module, is_package):
                bad.append(
                    f"{path.relative_to(root)}:{node.lineno}: {module} takes {', '.join(private)} of {node.module}"
                )
    return bad


def test_no_module_takes_another_rooms_underscore_names():
    bad = underscore_imports()
    assert not bad, "underscore names taken from another room (make them public names, or move them):\n" + "\n".join(
        bad
    )


# a subpackage of jobs/ -> the one module of it that code outside its parent may import
SEAMS = {"jobs.bench.flashrag": "jobs.bench.flashrag.locked_venv"}


def test_outside_code_imports_a_jobs_subpackage_through_its_seam_only(graph):
    bad = [
        f"{where(graph, m, dep)} imports {dep} (use {seam})"
        for package, seam in SEAMS.items()
        for m, dep in edges(graph)
        if dep.startswith(package + ".") and dep != seam and not m.startswith(package.rsplit(".", 1)[0] + ".")
    ]
    assert not bad, "imports past a seam:\n" + "\n".join(sorted(bad))


def rig_imports_of_commands(graph) -> list[str]:
    """Each import of jobs/bench/'s commands (or another of its subpackages) by jobs/bench/rig/, as `file:line: ...`."""

    def in_rig(module: str) -> bool:
        return module.split(".")[:3] == ["jobs", "bench", "rig"]

    return sorted(
        f"{where(graph, m, dep)} imports {dep}"
        for m, dep in edges(graph)
        if in_rig(m) and dep.split(".")[:2] == ["jobs", "bench"] and not in_rig(dep)
    )


def test_the_bench_rig_imports_none_of_the_bench_commands(graph):
    """jobs/bench/rig/ (what the benchmarks measure with and run on) stands below the `dynrag bench` commands."""
    bad = rig_imports_of_commands(graph)
    assert not bad, "jobs/bench/rig/ imports a bench command (move what it needs into the rig):\n" + "\n".join(bad)


def test_only_configuration_and_errors_directly_under_pipeline(graph):
    loose = {m for m in graph.modules if m.count(".") == 1 and m.startswith("pipeline.") and not graph.find_children(m)}
    assert loose <= {"pipeline.config", "pipeline.errors"}, loose


def test_the_checks_see_a_cycle_and_a_forbidden_import(tmp_path):
    """The checks above would fail on a bad graph (so a broken check cannot pass silently)."""
    bad = grimp.ImportGraph()
    for m in ("indexing", "indexing.a", "pipeline", "pipeline.b", "pipeline.c"):
        bad.add_module(m)
    bad.add_import(importer="indexing.a", imported="pipeline.b")
    bad.add_import(importer="pipeline.b", imported="pipeline.c")
    bad.add_import(importer="pipeline.c", imported="pipeline.b")
    with pytest.raises(AssertionError, match="must not import"):
        test_indexing_imports_neither_pipeline_nor_jobs(bad)
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycle_between_modules(bad)
    upward = grimp.ImportGraph()
    for m in (
        "pipeline",
        "pipeline.engine",
        "pipeline.engine.core",
        "pipeline.evaluation",
        "pipeline.evaluation.table",
    ):
        upward.add_module(m)
    upward.add_import(
        importer="pipeline.engine.core", imported="pipeline.evaluation.table", line_number=7, line_contents=""
    )
    with pytest.raises(AssertionError, match=r"pipeline/engine/core.py:7: engine imports pipeline.evaluation.table"):
        test_pipeline_imports_only_downward_between_its_layers(upward)
    past = grimp.ImportGraph()
    for m in (
        "jobs",
        "jobs.bench",
        "jobs.bench.flashrag",
        "jobs.bench.flashrag.env",
        "jobs.conform",
        "jobs.conform.env",
    ):
        past.add_module(m)
    past.add_import(importer="jobs.conform.env", imported="jobs.bench.flashrag.env", line_number=3, line_contents="")
    with pytest.raises(AssertionError, match=r"jobs/conform/env.py:3 imports jobs.bench.flashrag.env"):
        test_outside_code_imports_a_jobs_subpackage_through_its_seam_only(past)
    for m in ("jobs.bench.rig", "jobs.bench.rig.questions_child", "jobs.bench.questions"):
        past.add_module(m)
    past.add_import(
        importer="jobs.bench.rig.questions_child", imported="jobs.bench.questions", line_number=9, line_contents=""
    )
    with pytest.raises(AssertionError, match=r"jobs/bench/rig/questions_child.py:9 imports jobs.bench.questions"):
        test_the_bench_rig_imports_none_of_the_bench_commands(past)
    door = grimp.ImportGraph()
    for m in (
        "pipeline",
        "pipeline.methods",
        "pipeline.methods.x",
        "indexing",
        "indexing.builder",
        "indexing.builder.y",
    ):
        door.add_module(m)
    door.add_import(importer="pipeline.methods.x", imported="indexing.builder.y", line_number=5, line_contents="")
    with pytest.raises(AssertionError, match=r"pipeline/methods/x\S*:5: .* past indexing's front door"):
        test_rooms_are_entered_by_their_front_doors(door)
    for name, text in {
        "a/__init__.py": "",
        "a/x.py": "def _hidden(): ...\n",
        "a/z.py": "from a.x import _hidden\n",  # the same room: its own underscore names
        "b/__init__.py": "",
        "b/y.py": "import os\nfrom a.x import _hidden\n",
    }.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert underscore_imports(tmp_path, ("a", "b")) == ["b/y.py:2: b.y takes _hidden of a.x"]


def test_no_function_in_jobs_runs_over_80_lines():
    """A job's function reads in one screen: a longer one is split into steps with names."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((ROOT / "jobs").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, "functions over 80 lines in jobs/:\n" + "\n".join(long)


# tests/'s folders beside those that mirror a package: the fault-injection suite and the runs on Ray clusters
TEST_SUITES = {"faults", "cluster"}
TREE_CHECKS = {
    "test_layout.py",
    "test_readme.py",
    "test_locks.py",
    "test_bounded_waits.py",
}  # the tests of the whole tree, at tests/'s top


def test_the_tests_stand_in_folders_that_mirror_the_packages():
    """A module's tests are found from its path: tests/pipeline/engine/ holds pipeline/engine/'s (README "Layout")."""

    def placed(folder: Path, name: str) -> bool:
        if folder == Path("."):
            return name in TREE_CHECKS
        return str(folder) in TEST_SUITES or (folder.parts[0] in PACKAGES and (ROOT / folder).is_dir())

    tests = ROOT / "tests"
    misplaced = [
        str(p.relative_to(ROOT))
        for p in sorted(tests.rglob("test_*.py"))
        if not placed(p.parent.relative_to(tests), p.name)
    ]
    assert not misplaced, "test files outside a folder that mirrors a package (or faults/, cluster/):\n" + "\n".join(
        misplaced
    )


def cross_folder_test_imports(tests: Path = ROOT / "tests") -> list[str]:
    """Each import of a test module (test_*.py) by a module of tests/ in another folder, as `file:line: ...`."""
    folder_of = {path.stem: path.parent for path in tests.rglob("test_*.py")}
    bad = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            where_from = path.relative_to(tests.parent)
            bad += [
                f"{where_from}:{node.lineno}: imports {name} of {folder_of[name].relative_to(tests.parent)}/"
                for name in names
                if name in folder_of and folder_of[name] != path.parent
            ]
    return bad


def test_no_test_imports_a_test_module_of_another_folder(tmp_path):
    """A helper two folders' tests share lives at tests/'s top (fakes.py, fault_tools.py, ...), not in a test file."""
    bad = cross_folder_test_imports()
    assert not bad, "test modules imported from another folder (move the helper to tests/'s top):\n" + "\n".join(bad)
    for name, text in {
        "a/test_x.py": "from test_y import helper\n",
        "a/test_z.py": "import test_x\n",
        "b/test_y.py": "",
    }.items():
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text(text)
    assert cross_folder_test_imports(tmp_path / "tests") == ["tests/a/test_x.py:1: imports test_y of tests/b/"]
