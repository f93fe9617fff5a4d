"""The layer rule of docs/ARCHITECTURE.md, read from the code's own imports (stdlib `ast`, nothing is imported).

Every import counts, at module level and inside functions: a lazy import closes a loop as surely as
a top-level one, it only hides it. The rule:
- no import loops among the project's modules;
- `transforms/` (Beam transforms and their plain functions) never imports `pipeline/`;
- the read-side tools (`pipeline/{reader,verify,preview,benchmark}.py` and `pipeline/readers/`, their
  helpers) never import the converter's launcher, graph, planning, output preparation or local runner;
- `transforms/` is sub-packages by stage, each importing only itself and the ones before it in LAYERS
  (base, labels, inputs, images, detection, output): no module sits loose in `transforms/`;
- in `transforms/images/`, the conversion's modules by step (IMAGE_STEPS: the fast core, the settings,
  diagnosis, pixels, decode, encode, and imaging, which ties them together) import only the ones before them;
- the local-runner machinery (`pipeline/local/`) is imported by the launcher only;
- no module is named like a standard-library or popular package, so that no module of this project can
  shadow one (e.g. no `pipeline/inspect.py` or `transforms/io.py`).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tokenize

import pytest

from tests.conftest import REPO

PACKAGES = ("pipeline", "transforms")
READERS = "pipeline.readers"
READ_TOOLS = ("pipeline.reader", "pipeline.verify", "pipeline.preview", "pipeline.benchmark")
# transforms/' sub-packages, ground floor first: each may import its own modules and those of the ones before it.
LAYERS = ("transforms.base", "transforms.labels", "transforms.inputs", "transforms.images", "transforms.detection",
          "transforms.output")
# transforms/images/' conversion by step, lowest first: each may import only the ones before it in this list.
IMAGE_STEPS = ("transforms.images.fast", "transforms.images.settings", "transforms.images.diagnosis",
               "transforms.images.pixels", "transforms.images.decode", "transforms.images.encode",
               "transforms.images.imaging")
LOCAL = "pipeline.local"
# What the read-side tools may not import: the converter's run (launcher, graph, plan, output, cloud submission).
CONVERTER = ("pipeline.launcher", "pipeline.main", "pipeline.graph", "pipeline.plan", "pipeline.output_folder",
             "pipeline.cloud", "pipeline.demo", LOCAL)
# Popular third-party top-level names a module of ours must not take (the standard library's come from sys).
POPULAR = {
    "absl", "apache_beam", "attr", "attrs", "beam", "boto3", "click", "cv2", "dask", "google", "grain", "grpc",
    "h5py", "jax", "keras", "matplotlib", "numpy", "pandas", "PIL", "psutil", "pyarrow", "pytest", "requests",
    "scipy", "setuptools", "six", "sklearn", "tensorflow", "tf", "torch", "torchvision", "tqdm", "typing_extensions",
    "yaml", "array_record", "tensorflow_datasets", "tfds",
}


def module_files() -> dict[str, str]:
    """{dotted module name: file path} of every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if not name.endswith(".py"):
                    continue
                parts = os.path.relpath(os.path.join(folder, name), REPO)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = os.path.join(folder, name)
    return found


def imported(tree: ast.AST, module: str, is_package: bool = False):
    """(base, names) for each import anywhere in `tree`, the source of `module` (functions included), relative
    imports resolved: `import a.b` gives ("a.b", []), `from a import b, c` ("a", ["a.b", "a.c"]): each of those
    may be a module (`from pipeline import cloud`) or a name in the module `a` (`from pipeline.x import f`)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            yield base, [f"{base}.{alias.name}" for alias in node.names]


def imports_of(module: str, path: str, modules: set[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file (functions included)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    targets = set()
    for base, members in imported(tree, module, path.endswith("__init__.py")):
        names = [name if name in modules else base for name in members] or [base]
        for name in names:
            while name and name not in modules:  # `import transforms.images.convert.x` -> the longest known module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_reader_of_imports_sees_function_level_imports(graph):
    # pipeline/main.py imports the launcher inside main(): a reader that missed it would miss lazy loops too.
    assert "pipeline.launcher" in graph["pipeline.main"]
    assert "transforms.images.diagnosis" in graph["transforms.images.pool"]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: groups of modules that all reach each other (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_strongly_connected_finds_a_loop():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_loops(graph):
    loops = strongly_connected(graph)
    assert not loops, "import loops (break each with a lower module both can use): " + "; ".join(
        " <-> ".join(loop) for loop in loops)


def test_transforms_never_import_pipeline(graph):
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if in_package(m, "transforms")
                    for t in targets if in_package(t, "pipeline"))
    assert not upward, upward


def _read_side(module: str) -> bool:
    return in_package(module, READERS) or module in READ_TOOLS


def test_read_side_tools_never_import_the_converter(graph):
    assert set(READ_TOOLS) <= set(graph) and any(in_package(m, READERS) for m in graph), "a read-side tool is missing"
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _read_side(m)
                    for t in targets if any(in_package(t, c) for c in CONVERTER))
    assert not upward, upward


def _layer(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if in_package(module, layer)), None)


def test_every_transforms_module_is_in_a_stage_sub_package(graph):
    loose = sorted(m for m in graph if in_package(m, "transforms") and m != "transforms" and _layer(m) is None)
    assert not loose, f"modules outside transforms/' stage sub-packages {LAYERS}: {loose}"


def test_a_stage_imports_only_itself_and_the_stages_before_it(graph):
    assert all(layer in graph for layer in LAYERS), "a stage sub-package is missing"
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _layer(m) is not None
                    for t in targets if _layer(t) is not None and _layer(t) > _layer(m))
    assert not upward, f"imports of a later stage (move the shared part down a layer): {upward}"


def test_the_layer_rule_sees_an_upward_import():
    assert _layer("transforms.base.paths") == 0 and _layer("transforms.output.write") == 5
    assert _layer("transforms.baseline") is None  # a prefix is not the package


def _upward_steps(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m in IMAGE_STEPS
                  for t in targets if t in IMAGE_STEPS and IMAGE_STEPS.index(t) > IMAGE_STEPS.index(m))


def test_each_image_step_imports_only_the_steps_before_it(graph):
    assert set(IMAGE_STEPS) <= set(graph), "an image step module is missing"
    upward = _upward_steps(graph)
    assert not upward, f"an image step imports a later one (move the shared part down): {upward}"


def test_the_image_step_rule_sees_an_upward_import(graph):
    assert _upward_steps({**graph, "transforms.images.diagnosis": {"transforms.images.decode"}}) == [
        "transforms.images.diagnosis -> transforms.images.decode"]


def test_only_the_launcher_imports_the_local_runner(graph):
    assert any(in_package(m, LOCAL) for m in graph), "pipeline/local/ is missing"
    outside = sorted(f"{m} -> {t}" for m, targets in graph.items()
                     if not in_package(m, LOCAL) and m != "pipeline.launcher"
                     for t in targets if in_package(t, LOCAL))
    assert not outside, outside


def test_no_module_named_like_a_popular_package(graph):
    taken = set(sys.stdlib_module_names) | POPULAR
    shadowing = sorted(m for m in graph if m.rpartition(".")[2] in taken)
    assert not shadowing, f"modules named like a standard-library or popular package: {shadowing}"


@pytest.mark.parametrize("tool", ["verify", "preview", "benchmark"])
def test_python_m_runs_each_read_side_tool(tool):
    # README and docs/ give `python -m pipeline.<tool>`: the module is the tool itself, not a forward.
    result = subprocess.run([sys.executable, "-m", f"pipeline.{tool}", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m pipeline.{tool}")
    with open(os.path.join(REPO, "pipeline", f"{tool}.py"), encoding="utf-8") as f:
        assert "runpy" not in f.read()


# -- the read side without Beam (issues 27 and 31) -------------------------------------------------------------------

READ_SIDE = (*READ_TOOLS, "pipeline.readers.bench_input", "pipeline.readers.bench_report", "pipeline.readers.strategy")
# What a dataset folder is (names, shards, schemas, splits, the description's loader) and paths: imported by the
# converter and the read side alike, so neither Beam nor TensorFlow.
GROUND = ("transforms.base.dataset_format", "transforms.base.paths", "transforms.base.duplicate_kinds",
          "transforms.base.tfrecord")
def _python(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_the_read_side_imports_no_beam_and_its_tools_load_keras_only_when_it_is_used():
    # The tools import TensorFlow with import_tensorflow before the read side's modules (which import it too):
    # Keras and pandas stay out until tf.keras is used, and then it works.
    imports = "; ".join(f"import {module}" for module in READ_SIDE)
    result = _python("import sys; from pipeline.cli import import_tensorflow; tf = import_tensorflow(); "
                     f"{imports}; print(sorted(m for m in sys.modules if m.startswith('apache_beam'))); "
                     "print(sorted({m.split('.')[0] for m in sys.modules} & {'keras', 'pandas'})); "
                     "print(tf.keras.layers.Dense(2)(tf.ones([1, 3])).shape)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-3:] == ["[]", "[]", "(1, 2)"], result.stdout


def test_the_format_and_paths_modules_import_neither_beam_nor_tensorflow():
    imports = "; ".join(f"import {module}" for module in GROUND)
    result = _python(f"import sys; {imports}; "
                     "print(sorted({m.split('.')[0] for m in sys.modules} & {'apache_beam', 'tensorflow'}))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def _module_constants(path: str) -> set[str]:
    """The upper-case public names a module assigns at its top level."""
    with open(path, encoding="utf-8") as f:
        body = ast.parse(f.read(), path).body
    targets = [t for node in body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in body if isinstance(node, ast.AnnAssign)]
    return {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_")}


def test_what_a_dataset_folder_is_has_one_home():
    # A second home would define one of dataset_format's names again (a file name, the shard patterns, the splits,
    # the schemas): only dataset_format assigns them at module level.
    files = module_files()
    own = _module_constants(files["transforms.base.dataset_format"])
    assert {"INFO_FILE", "SPLITS", "SCHEMAS", "SHARD_NAME", "KAGGLE_NAME", "SPLIT_NAMES"} <= own
    again = sorted(f"{module}.{name}" for module, path in files.items() if module != "transforms.base.dataset_format"
                   for name in _module_constants(path) & own)
    assert not again, f"defined again outside transforms/base/dataset_format.py: {again}"


# Questions with one answer in one place: {what a second spelling looks like: the modules that may spell it}.
ONE_SPELLING = {
    'startswith("gs://")': {"transforms.base.paths"},  # is this path on Cloud Storage: paths.is_gcs
    "get_scheme(": set(),  # is this path local / on GCS: paths.is_local, paths.is_gcs
    "storage.Client(": {"transforms.base.paths"},  # the read side's client; the converter's: transforms.base.gcs
    'counters.inc("rejected_...")': set(),  # a rejection's counter name: counters.rejected(reason)
    "the split names": {"transforms.base.dataset_format"},  # ("train", "validation", "test"): SPLITS
    # what a shard format allows: its ShardFormat record; only the writer's and the reader's choice go by name
    "a shard format by name": {"transforms.base.dataset_format", "transforms.output.shardfiles",
                               "transforms.base.tfrecord"},
}
_FORMAT_NAMES = {"ARRAY_RECORD", "TFRECORD", "array_record", "tfrecord"}


def _spellings(source: str) -> list[tuple[str, int]]:
    """The ONE_SPELLING forms in `source`: (form, line)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and {"train", "validation", "test"} <= {
                e.value for e in node.elts if isinstance(e, ast.Constant)}:
            found.append(("the split names", node.lineno))
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops) and any(
                (isinstance(e, ast.Name) and e.id in _FORMAT_NAMES)
                or (isinstance(e, ast.Constant) and e.value in _FORMAT_NAMES) for e in [node.left, *node.comparators]):
            found.append(("a shard format by name", node.lineno))
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, node.args
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = args[0] if args else None
        text = (first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else
                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                and isinstance(first.values[0], ast.Constant) else None)
        if name == "startswith" and text is not None and text.startswith("gs:"):
            found.append(('startswith("gs://")', node.lineno))
        elif name == "get_scheme":
            found.append(("get_scheme(", node.lineno))
        elif name == "Client" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "storage":
            found.append(("storage.Client(", node.lineno))
        elif name == "inc" and text is not None and text.startswith("rejected_"):
            found.append(('counters.inc("rejected_...")', node.lineno))
    return found


def test_each_question_about_a_path_or_a_counter_has_one_spelling():
    # "Is this path on GCS" is paths.is_gcs, "is it local" paths.is_local, the converter's GCS client
    # transforms.base.gcs.client() (the read side's: paths), a rejection's counter counters.rejected(reason),
    # the splits dataset_format.SPLITS, what a shard format allows its dataset_format.ShardFormat.
    again = []
    for module, path in module_files().items():
        with open(path, encoding="utf-8") as f:
            for form, line in _spellings(f.read()):
                if module not in ONE_SPELLING[form]:
                    again.append(f"{os.path.relpath(path, REPO)}:{line}: {form}")
    assert not again, f"spelled again outside its home (use paths.is_gcs / is_local, gcs.client(), " \
                      f"counters.rejected): {again}"


def test_the_one_spelling_rule_sees_each_form():
    source = ('if path.startswith("gs://"): pass\nFileSystems.get_scheme(p)\nstorage.Client()\n'
              'counters.inc(f"rejected_{reason}")\ncounters.inc(counters.rejected(reason))\n'
              'for split in ("train", "validation", "test"): pass\nif file_format == ARRAY_RECORD: pass\n')
    assert _spellings(source) == [('startswith("gs://")', 1), ("get_scheme(", 2), ("storage.Client(", 3),
                                  ('counters.inc("rejected_...")', 4), ("the split names", 6),
                                  ("a shard format by name", 7)]


# -- the tests' shared helpers (issue 27) ----------------------------------------------------------------------------


def _test_files_imported(module: str, source: str, is_package: bool = False) -> set[str]:
    """The tests/test_*.py modules (tests.test_x) that `module`, a module of tests/ given its source, imports
    anywhere in its file (functions included; relative imports too)."""
    found = set()
    for base, members in imported(ast.parse(source), module, is_package):
        for name in (base, *members):  # `from tests import test_x` imports tests.test_x, as `from tests.test_x ...`
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "tests" and parts[1].startswith("test_"):
                found.add(".".join(parts[:2]))
    return found


def test_the_test_file_rule_sees_every_form_of_import():
    source = """
import tests.conftest
import tests.test_b.inner
from tests import datasets, test_c as c
from tests.datasets import read_records
from tests.test_a import helper

def f():
    from .test_d import other
    from . import crash_helpers
"""
    assert _test_files_imported("tests.test_x", source) == {"tests.test_a", "tests.test_b", "tests.test_c",
                                                            "tests.test_d"}


def test_no_module_of_tests_imports_a_test_file():
    """No module of tests/ imports a test file (tests/test_*.py): what files share lives in a helper module."""
    folder = os.path.join(REPO, "tests")
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
                is_package = parts[-1] == "__init__"
                module = ".".join(parts[:-1] if is_package else parts)
                with open(path, encoding="utf-8") as f:
                    targets = _test_files_imported(module, f.read(), is_package)
                found += [f"{module} -> {target}" for target in sorted(targets)]
    assert not found, f"test files imported (move what they share to a helper module of tests/): {found}"


# Beam's non-public names, as the code spells them where it touches them (issue 46): private modules, the runner's
# and worker's internals, a module function replaced in place, a file system's private attribute.
PRIVATE_BEAM = re.compile("|".join((
    r"apache_beam\.(internal|utils|runners\.dataflow\.internal|runners\.worker)\b",
    r"fn_api_runner(\.| import .*\b)(fn_runner|worker_handlers)\b",
    r"\b(fn_runner|worker_handlers|sdk_worker_main|apiclient|auth)\.[A-Za-z_]",
    r"core\.get_function_arg", r"gcsio\.create_storage_client", r"\"_pipeline_options\"",
    r"\bsys\.modules\.get\(\"apache_beam",
)))


def code_lines(path: str) -> list[tuple[int, str]]:
    """(number, text) of the lines of a module that hold code: comments and docstrings left out."""
    skipped = set()
    with open(path, encoding="utf-8") as source:
        tokens = list(tokenize.generate_tokens(source.readline))
    starts_statement = True
    for token in tokens:
        if token.type == tokenize.STRING and starts_statement:
            skipped.update(range(token.start[0], token.end[0] + 1))  # a docstring (a string that is a statement)
        if token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            starts_statement = token.type in (tokenize.NEWLINE,) or (token.type == tokenize.OP and token.string == ":")
    with open(path, encoding="utf-8") as source:
        lines = source.read().splitlines()
    return [(n, text.split("#", 1)[0]) for n, text in enumerate(lines, 1) if n not in skipped]


def private_beam_lines() -> list[str]:
    """'path:line' of every line of the product's code (pipeline/, transforms/, dataflow/) that names a non-public
    Beam name (PRIVATE_BEAM)."""
    found = []
    for path in [*module_files().values(), os.path.join(REPO, "dataflow", "launch.py")]:
        for number, text in code_lines(path):
            if PRIVATE_BEAM.search(text):
                found.append(f"{os.path.relpath(path, REPO)}:{number}")
    return sorted(found)


def test_the_lines_that_touch_private_beam_names_are_the_number_architecture_md_gives():
    with open(os.path.join(REPO, "docs", "ARCHITECTURE.md"), encoding="utf-8") as doc:
        stated = re.search(r"Lines that touch non-public Beam names: (\d+)", doc.read())
    assert stated, "docs/ARCHITECTURE.md states no count of the lines that touch non-public Beam names"
    lines = private_beam_lines()
    assert len(lines) == int(stated[1]), f"{len(lines)} lines, not {stated[1]}: {lines}"


def test_the_private_beam_count_sees_each_form_and_skips_comments_and_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Uses apache_beam.runners.worker.sdk_worker_main."""\n'
                      "from apache_beam.runners.portability.fn_api_runner import worker_handlers\n"
                      "from apache_beam.runners.portability.fn_api_runner import FnApiRunner\n"
                      "# fn_runner.ProgressRequester in a comment\n"
                      "x = fn_runner.ProgressRequester\n"
                      "def f():\n"
                      '    """gcsio.create_storage_client in a docstring."""\n'
                      "    core.get_function_arguments = None  # and a comment\n"
                      "y = 'public'\n")
    lines = [n for n, text in code_lines(str(module)) if PRIVATE_BEAM.search(text)]
    assert lines == [2, 5, 8]


def test_every_test_pipeline_names_its_runner():
    """Beam's TestPipeline without a runner tries the Prism runner (a download) first: tests use tests/pipelines.py."""
    offenders = []
    for name in sorted(os.listdir(os.path.join(REPO, "tests"))):
        if name.endswith(".py") and name != "pipelines.py":
            with open(os.path.join(REPO, "tests", name), encoding="utf-8") as source:
                if re.search(r"^\s*(from apache_beam\.testing(\.test_pipeline)? import|import apache_beam\.testing)",
                             source.read(), re.M):
                    offenders.append(name)
    assert offenders == []
