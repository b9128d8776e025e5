"""The tree's rules, checked on the real import graph (grimp parses every module; imports inside functions and
`if TYPE_CHECKING:` imports count too): `platform_shims` is below everything, `indexing` is a library below
`pipeline` and `jobs`, `indexing/` and `pipeline/` are stacks of rooms (`INDEXING_ROOMS`, `LAYERS`) that import
only downward, and no two modules of the project import each other in a cycle, not even to name a type (a module
that needs the type of one importing it names a Protocol of its own, as retrievers.py's `IndexVersion`). A failure
names each offending import by file and line."""

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


def test_the_readme_lists_pipelines_layers_top_down():
    """README "Layout" names each layer on its own row, in LAYERS' order from the top, so a reader sees the rule."""
    rows = [
        line.split("`")[1] for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `pipeline/")
    ]
    named = [r.removeprefix("pipeline/").removesuffix("/").removesuffix(".py") for r in rows]
    assert [n for n in named if n in LAYERS] == list(reversed(LAYERS)), named


def test_no_import_cycle_between_modules(graph):
    g = nx.DiGraph(edges(graph))
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    shown = [
        "; ".join(f"{where(graph, m, dep)} imports {dep}" for m in c for dep in c if g.has_edge(m, dep)) for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


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


def test_only_configuration_and_errors_directly_under_pipeline(graph):
    loose = {m for m in graph.modules if m.count(".") == 1 and m.startswith("pipeline.") and not graph.find_children(m)}
    assert loose <= {"pipeline.config", "pipeline.errors"}, loose


def test_the_checks_see_a_cycle_and_a_forbidden_import():
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
