"""The `image-tfrecords` command (pipeline/command.py): its subcommands, their help pages and its errors, in-process.

The installed command itself runs in tests/test_sdist.py, from a source distribution installed in a fresh venv.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from pipeline import __version__, command
from pipeline.cli import main_of
from tests.conftest import REPO


def print_module_help(tool: str) -> None:
    """Print what `python -m pipeline.<tool> --help` prints, in-process."""
    if tool == "convert":
        from pipeline import main

        assert main.main(["--help"]) == 0
        return
    module = {"verify": "pipeline.verify", "preview": "pipeline.preview",
              "benchmark": "pipeline.benchmark"}[tool]
    run = __import__(module, fromlist=["run"]).run
    with pytest.raises(SystemExit) as stopped:
        main_of(run, ["--help"])
    assert stopped.value.code == 0


def usage_and_rest(text: str) -> tuple[list[str], str]:
    """(the usage block's words after the program name, everything after the usage block)."""
    usage, _, rest = text.partition("\n\n")
    return usage.split(), rest


@pytest.mark.parametrize("tool, module_form", [("convert", "python -m pipeline.main"),
                                               ("verify", "python -m pipeline.verify"),
                                               ("preview", "python -m pipeline.preview"),
                                               ("benchmark", "python -m pipeline.benchmark")])
def test_each_subcommand_shows_its_modules_help_under_its_own_name(tool, module_form, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    print_module_help(tool)
    by_module = capsys.readouterr().out
    assert command.main([tool, "--help"]) == 0
    by_command = capsys.readouterr().out
    assert by_module.startswith(f"usage: {module_form} ")
    assert by_command.startswith(f"usage: image-tfrecords {tool} ")
    module_words, module_rest = usage_and_rest(by_module)
    command_words, command_rest = usage_and_rest(by_command)
    # The same options in the same order in the usage line; the same description and options list, word for word.
    assert command_words[3:] == module_words[4:]  # after "usage: image-tfrecords verify", "usage: python -m ..."
    assert command_rest == module_rest
    assert "--" in command_rest
    # The module form is unchanged afterwards: the command's name does not stick.
    print_module_help(tool)
    assert capsys.readouterr().out == by_module


def test_the_command_help_lists_every_subcommand_with_its_module_form(capsys):
    assert command.main(["--help"]) == 0
    assert command.main(["-h"]) == 0
    out, again = capsys.readouterr().out.split("usage: ")[1:]
    assert out == again
    assert out.startswith("image-tfrecords {convert,verify,preview,benchmark}")
    for tool, module_form in [("convert", "pipeline.main"), ("verify", "pipeline.verify"),
                              ("preview", "pipeline.preview"), ("benchmark", "pipeline.benchmark")]:
        assert any(line.split()[:1] == [tool] and f"(python -m {module_form})" in line for line in out.splitlines())


def test_version(capsys):
    assert command.main(["--version"]) == 0
    assert capsys.readouterr().out == f"image-tfrecords {__version__}\n"


@pytest.mark.parametrize("argv, message", [
    ([], "error: give a subcommand: convert, verify, preview, benchmark (image-tfrecords --help says what each "
         "does)\n"),
    (["convrt", "--input_dir=x"], "error: unknown subcommand 'convrt': give one of convert, verify, preview, "
                                  "benchmark (image-tfrecords --help)\n"),
    (["--input_dir=photos/"], "error: --input_dir=photos/ comes after a subcommand: image-tfrecords SUBCOMMAND "
                              "[options], with SUBCOMMAND one of convert, verify, preview, benchmark\n"),
])
def test_no_or_an_unknown_subcommand_is_one_error_line_and_exit_code_2(argv, message, capsys):
    assert command.main(argv) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message)


def test_a_subcommands_errors_are_its_modules(tmp_path, capsys):
    assert command.main(["verify", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} has no image_tfrecords.json") and err.count("\n") == 1
    assert command.main(["preview", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: nothing to draw: give --contact_sheet=FILE.png and/or "
                                       "--class_chart=FILE.png\n")
    # argparse's own usage errors name the command and keep their exit code.
    assert command.main(["verify", "--no_such_option", str(tmp_path)]) == 2
    assert "image-tfrecords verify: error: unrecognized arguments: --no_such_option" in capsys.readouterr().err


def test_the_command_converts_a_folder_in_process(sample_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "freeze", lambda: None)  # pipeline.main freezes the heap of a process about to end
    out = tmp_path / "out"
    assert command.main(["convert", f"--input_dir={sample_tree}", f"--output_dir={out}", "--quiet",
                         "--direct_running_mode=in_memory", "--direct_num_workers=1"]) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["circle", "square", "stripes", "triangle"]
    assert sum(split["records"] for split in info["splits"].values()) == 160


def test_the_dispatcher_imports_only_what_the_subcommand_imports():
    # In a fresh interpreter: the command alone imports no Beam, TensorFlow or tool; verify imports no converter.
    script = """if True:
        import sys
        from pipeline import command
        assert not {"apache_beam", "tensorflow", "pipeline.readers", "pipeline.main"} & set(sys.modules), sys.modules
        try:
            command.main(["verify", "--help"])
        finally:
            print(sorted(m for m in sys.modules if m.startswith("pipeline")))
    """
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(eval(done.stdout.splitlines()[-1]))
    assert "pipeline.verify" in loaded
    converter = {"pipeline.main", "pipeline.launcher", "pipeline.graph", "pipeline.plan", "pipeline.output_folder",
                 "pipeline.cloud", "pipeline.local", "pipeline.preview", "pipeline.benchmark"}
    assert not loaded & converter, loaded & converter
