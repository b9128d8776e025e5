"""The tree's rules, checked on the real import graph (grimp; imports inside functions count too):
`indexing` is a library below `pipeline` and `jobs` (type-only imports count), and no two modules of the
project import each other in a cycle when run (an `if TYPE_CHECKING:` import, there to name a type, is not
run: a retriever module may name the `Index` that imports it)."""

import grimp
import networkx as nx
import pytest

PACKAGES = ("indexing", "pipeline", "jobs")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)


@pytest.fixture(scope="module")
def run_graph():
    return grimp.build_graph(
        *PACKAGES, include_external_packages=False, exclude_type_checking_imports=True, cache_dir=None
    )


def edges(graph):
    return [(m, dep) for m in graph.modules for dep in graph.find_modules_directly_imported_by(m)]


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


def test_no_import_cycle_between_modules(run_graph):
    g = nx.DiGraph(edges(run_graph))
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


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
