"""Launcher-side preparation of --output_dir: what an existing dataset means, the lock, an earlier run's leftovers.

Which files of the output folder are this tool's, and the publishing of a run's
files, live in `transforms.output.ownership` and `transforms.output.publishing`,
which the job's last step uses too. Here the launcher decides, before anything
is converted:

* an existing complete dataset: refused (the default), replaced once the new
  run is complete (`--if_exists=overwrite`), or, for schedulers, accepted as the
  result when it was made with the same options (`--if_exists=skip`);
* the lock: one run per output folder; a lock whose run has ended (its process
  on this machine, or its Dataflow job) is taken over, any other stops this run;
* leftovers of interrupted runs: removed, since the lock proves they are dead; the temporary folder of one
  whose plan (`transforms.output.resume`, plan.json) is this run's is kept for this run to resume, and goes once this
  run has published. Only temporary files are leftovers: a file under a final name in a folder without a dataset
  is no run's that can be proven, and is never deleted (`_check_unclaimed`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import threading
import uuid
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import cloud
from pipeline.errors import UserError
from pipeline.options import Settings
from pipeline.plan import Plan
from transforms.base import bounded, gcs
from transforms.base.dataset_format import CLASSIFICATION, FORMAT_VERSION, SOURCES_NAME, TEMP_DIR
from transforms.base.paths import is_gcs, is_local, relative_to
from transforms.inputs.append import FREE_OPTIONS
from transforms.output.files import delete_files
from transforms.output.lock import (
    LockHeld,
    LockUnsupported,
    acquire_lock,
    describe_holder,
    local_holder_alive,
    lock_holder,
    lock_path,
    release_lock,
)
from transforms.output.ownership import (
    BEAM_TEMP_DIR,
    UnsafePath,
    check_own_path,
    check_own_paths,
    check_own_tree,
    completion_marker,
    dataset_files,
    existing_description,
    final_outputs,
    run_dir,
    temporary_outputs,
)
from transforms.output.publishing import finish_publish, interrupted_publish, remove_run_dir
from transforms.output.resume import PLAN_FILE, Earlier, fingerprint, plan_differences, read_plan, write_plan

_LOG = logging.getLogger("pipeline")


def read_existing_info(output_dir: str) -> dict | None:
    """The output folder's image_tfrecords.json (or version 1's dataset_info.json), None when there is none.

    {} when it is unreadable (`ownership.existing_description`).
    """
    found = existing_description(output_dir)
    return None if found is None else found[1]


def option_differences(recorded: dict, settings: Settings) -> list[str]:
    """The options in which a recorded dataset differs from this run's, as 'name: old -> new'.

    An option that a dataset of an earlier version does not record counts as its default then.
    """
    from pipeline.options import validate

    current = bounded.loads(json.dumps(settings.as_dict()))
    defaults = validate(PipelineOptions(["--input_dir=.", "--output_dir=."])).as_dict()
    recorded = {**{name: value for name, value in defaults.items() if name not in recorded}, **recorded}
    names = sorted(set(recorded) | set(current))
    return [f"{name}: {recorded.get(name)!r} -> {current.get(name)!r}" for name in names
            if recorded.get(name) != current.get(name)]


def existing_dataset(settings: Settings, options: PipelineOptions | None = None) -> str | None:
    """Apply --if_exists to a complete dataset already in the output folder.

    Returns a message when there is nothing to do (`skip`, same options, and no
    live run holds the folder's lock), None when this run goes ahead.

    Raises:
        UserError: a dataset is there and --if_exists says refuse, or says skip but its options differ or another
            run is writing the folder (an --overwrite may be replacing the dataset).
    """
    info = read_existing_info(settings.output_dir)
    if info is None or settings.if_exists == "overwrite":
        return None
    marker = os.path.basename(completion_marker(settings.output_dir) or "")
    where = f"--output_dir {settings.output_dir} already holds a dataset ({marker})"
    if settings.if_exists == "append":
        check_appendable(settings, info)
        return None
    if settings.if_exists == "refuse":
        raise UserError(f"{where}: pass --if_exists=overwrite (or --overwrite) to replace it, --if_exists=skip to "
                        "accept it when it was made with the same options, or choose another folder")
    differences = option_differences(info.get("options") or {}, settings)
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        raise UserError(f"{where}, made with other options ({shown}): --if_exists=skip accepts only a dataset of "
                        "the same options; pass --if_exists=overwrite to replace it, or choose another folder")
    options = options if options is not None else PipelineOptions([])
    gcs_client = gcs.client() if is_gcs(settings.output_dir) else None
    writer = lock_holder(settings.output_dir, lambda other: why_stale(other, options), gcs_client)
    if writer is not None:
        raise UserError(f"{where} made with the same options, but it is being written by {describe_holder(writer)}, "
                        "which may replace it: --if_exists=skip accepts a dataset only while no run writes the "
                        "folder; run the same command again once that run has finished")
    files = info.get("files") or {}
    return (f"{settings.output_dir} already holds a complete dataset made with the same options "
            f"({files.get('written', '?')} images, created {info.get('created', '?')}); nothing to do "
            "(--if_exists=skip)" + _older_format(info))


def check_appendable(settings: Settings, info: dict) -> None:
    """--if_exists=append: the dataset in the output folder can grow by this run's images.

    Raises:
        UserError: its description is unreadable, it lists no sources files (made by an earlier version), or the
            options that shape records or their splits differ from its own (one line naming them).
    """
    where = f"--if_exists=append: the dataset in {settings.output_dir}"
    rebuild = "pass --if_exists=overwrite to convert everything again, or choose another folder"
    if not info or info.get("format_version") != FORMAT_VERSION or not isinstance(info.get("splits"), dict):
        raise UserError(f"{where} has a description this version cannot grow (format version "
                        f"{info.get('format_version', '?')}): {rebuild}")
    held_task = info.get("task") or CLASSIFICATION
    if held_task != settings.task:  # the records' keys, labels.txt's meaning and the accounting all differ
        raise UserError(f"{where} holds {held_task} records and this run writes {settings.task} records "
                        f"(--task={settings.task}): one dataset holds one kind of record; append into a "
                        f"{settings.task} dataset, or {rebuild}")
    sources = info.get("sources")
    if not isinstance(sources, dict) or not isinstance(sources.get("files"), list):
        raise UserError(f"{where} was made by an earlier version, which recorded no sources files (the paths and "
                        f"SHA-256 of its records), so which images it holds is not known: {rebuild}")
    if (info.get("options") or {}).get("duplicates") == "drop" and settings.duplicates != "drop":
        raise UserError(f"{where} was made with --duplicates=drop, and an append with --duplicates="
                        f"{settings.duplicates} would write the copies it dropped: pass --duplicates=drop, or "
                        f"{rebuild}")
    differences = [d for d in option_differences(info.get("options") or {}, settings)
                   if d.split(":", 1)[0] not in FREE_OPTIONS]
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise UserError(f"{where} was made with other options that shape its records or splits ({shown}): give "
                        f"the dataset's own values, or {rebuild}")


def append_base(settings: Settings, plan: Plan) -> None:
    """Give `plan` the dataset this run grows (--if_exists=append), read again under the folder's lock.

    Its class names are the run's: a class the dataset lacks would shift every label id.

    Raises:
        UserError: the input has class folders the dataset does not know, or the dataset changed meanwhile.
    """
    info = read_existing_info(settings.output_dir)
    if settings.if_exists != "append" or info is None:
        return
    check_appendable(settings, info)
    names = list(info.get("class_names") or [])
    new = sorted(set(plan.class_names) - set(names))
    if settings.detection:
        # A detection dataset's classes grow: its own keep their ids, a new one takes the next (of the names the
        # launcher knows now, YOLO's or --labels_file's; else of those the job finds: ReadAnnotations' `known`).
        plan.class_names = names + [name for name in plan.class_names if name not in names] if plan.class_names \
            else []
        plan.base_class_names = names
    elif new:
        raise UserError(f"--if_exists=append: the input has {len(new)} class(es) that the dataset in "
                        f"{settings.output_dir} does not ({', '.join(new[:5])}), and adding a class would change "
                        "the label ids of its records: pass --if_exists=overwrite to convert everything again, or "
                        "move those folders out of --input_dir")
    else:
        plan.class_names = names
    plan.base = info
    plan.base_sources = held_sources(settings.output_dir, info["sources"]["files"])


def held_sources(output_dir: str, names: list) -> list[str]:
    """The paths of the sources files a dataset's description lists, each checked to be there (one listing of
    each; they are read in the job, where their lines are counted against the records per split).

    Raises:
        UserError: a name that is not a sources file's, or a file that is missing: the dataset cannot say which
            images it holds, and an append would write those of the file a second time.
    """
    where = f"--if_exists=append: the dataset in {output_dir}"
    rebuild = "nothing was changed; convert the folder again with --if_exists=overwrite"
    odd = [name for name in names if not isinstance(name, str) or not SOURCES_NAME.fullmatch(name)]
    if odd:
        raise UserError(f"{where} lists {odd[0]!r} among its sources files, which is no name of one: its "
                        f"description is damaged; {rebuild}")
    paths = [FileSystems.join(output_dir, name) for name in names]
    for path, found in zip(paths, FileSystems.match(paths), strict=True):
        if not found.metadata_list:
            raise UserError(f"{where} lists the sources file {path}, which is missing: without its lines the "
                            f"dataset cannot say which images it holds, and an append would write them a second "
                            f"time; {rebuild}")
    return paths


def _older_format(info: dict) -> str:
    """What a dataset of format version 1 lacks, for the --if_exists=skip message."""
    if info.get("format_version") != 1:
        return ""
    return ("; it is of format version 1, without TensorFlow Datasets' files: --if_exists=overwrite converts it "
            "again so that tfds.builder_from_directory loads it")


def why_stale(holder: dict, options: PipelineOptions) -> str | None:
    """Why another run's lock is stale, or None while that run may still be going on."""
    if not holder.get("run_id"):
        return "the lock file is unreadable (a run stopped while it wrote it)"
    if holder.get("runner") == "dataflow":
        return cloud.dataflow_lock_stale(holder, options)
    alive = local_holder_alive(holder)
    if alive is False:
        return f"its process {holder.get('pid')} on {holder.get('host')} has ended"
    return None


def take_lock(settings: Settings, holder: dict, options: PipelineOptions) -> None:
    """Take the output folder's lock for this run, or stop with one line naming the run that has it.

    Raises:
        UserError: another run (or a Dataflow job) is writing to the folder.
    """
    gcs_client = gcs.client() if is_gcs(settings.output_dir) else None
    try:
        taken_over = acquire_lock(settings.output_dir, holder, lambda other: why_stale(other, options), gcs_client)
    except LockHeld as held:
        raise UserError(f"--output_dir {settings.output_dir} is being written by {describe_holder(held.holder)}: two "
                        f"runs must not write one folder; {_lock_advice(settings.output_dir, held)}, or choose "
                        "another folder") from None
    except LockUnsupported as e:
        raise UserError(f"--output_dir {settings.output_dir} cannot be locked against a second run: {e}") from None
    except PermissionError as e:  # a shared folder: another user's stale lock file, which this user may not delete
        raise UserError(f"--output_dir {settings.output_dir}: the lock file {lock_path(settings.output_dir)} of a run "
                        f"that has ended belongs to another user and cannot be replaced ({e.strerror}): ask its owner "
                        "to delete it, or choose another folder") from None
    if taken_over:
        _LOG.warning("Took over the lock of %s: %s", settings.output_dir, taken_over)


def _lock_advice(output_dir: str, held: LockHeld) -> str:
    """What to do about the live run that holds the lock."""
    other = held.holder
    if other.get("runner") == "dataflow" and not other.get("job_id"):  # its end cannot be proven: never taken over
        listing = (f"gcloud dataflow jobs list --region={other.get('region')} --project={other.get('project')}"
                   + (f" --filter=name={other['job_name']}" if other.get("job_name") else ""))
        return (f"its lock holds no job id yet and no Dataflow job of it is known to have ended, so it is kept: wait "
                f"for that job to finish (a finished job releases the lock); if no job of that launch runs "
                f"({listing}), delete {held.path} and run again")
    if other.get("runner") == "dataflow":
        return ("wait for that job to finish (a finished job releases the lock), or cancel it with gcloud dataflow "
                "jobs cancel")
    if not other.get("run_id"):
        return "wait for that run to finish, then run again"
    alive = local_holder_alive(other)
    if is_local(output_dir):  # the kernel says that its process runs, wherever that is
        if alive:
            return "wait for it to finish, or stop it (Ctrl-C), then run again"
        if other.get("host") == socket.gethostname():
            return ("that process is not visible from here (another container or PID namespace): wait for it to "
                    "finish or stop it there, then run again")
        return f"wait for it to finish, or stop it on {other.get('host') or 'its machine'}, then run again"
    if alive:
        return "wait for it to finish, or stop it (Ctrl-C), then run again"
    where = f"on {other['host']}" if other.get("host") else "anywhere"
    return f"wait for it to finish; if it is no longer running {where}, delete {held.path} and run again"


def give_back_lock(settings: Settings, run_id: str) -> None:
    """Release this run's lock if it still holds it (the job's last step usually has)."""
    try:
        release_lock(settings.output_dir, run_id, gcs.client() if is_gcs(settings.output_dir) else None)
    except Exception as e:  # never hide the run's own outcome behind this
        _LOG.warning("Could not release the lock %s (%s): delete it by hand if no run is writing there",
                     lock_path(settings.output_dir), e)


@dataclass
class OldOutputs:
    """Leftovers of interrupted runs that `prepare_output` took out of the output folder.

    With `background=True` their bytes may still be on their way out: call `wait()`. `done`: what to
    print when finishing an interrupted publishing left the dataset this run would make (the same options).
    """

    paths: list[str]
    deleting: threading.Thread | None = None
    done: str | None = None
    resumed: list = dataclasses.field(default_factory=list)  # Earlier: interrupted runs of this run's plan, kept

    def wait(self) -> None:
        """Return once the files are deleted."""
        if self.deleting is not None:
            self.deleting.join()


def _move_aside(output_dir: str, run_id: str, stale: list[str], kept: tuple = ()) -> str:
    """Move `stale` (local paths in `output_dir`) into one new folder inside this run's temporary folder.

    A rename is instant whatever the file's size, so the names are free at
    once; an interrupted deletion is finished by the next run, for which this
    run's folder is a leftover.
    """
    temp = os.path.join(output_dir, TEMP_DIR)
    aside = os.path.join(run_dir(output_dir, run_id), f"old-{uuid.uuid4().hex[:8]}")
    os.makedirs(aside)
    mine = run_dir(output_dir, run_id)
    for entry in os.listdir(temp):  # interrupted runs' folders, wholly theirs
        path = os.path.join(temp, entry)
        if path != mine and entry not in kept:
            os.rename(path, os.path.join(aside, entry))
    for index, path in enumerate(stale):
        if not path.startswith(temp + os.sep) and os.path.lexists(path):
            os.rename(path, os.path.join(aside, f"{index}-{os.path.basename(path)}"))
    return aside


def prepare_output(settings: Settings, run_id: str, dry_run: bool = False, background: bool = False,
                   record: dict | None = None) -> OldOutputs:
    """Make `output_dir` ready for run `run_id`, which must hold the folder's lock.

    Leftovers of interrupted runs go: their temporary folders and files. Files
    under final names in a folder without a complete dataset are no run's that
    can be proven: they stop the run, or are named and left (`_check_unclaimed`).
    A complete dataset stays untouched: the new run replaces it only once it has finished.
    A run that was stopped while it published has its publishing finished first
    (`transforms.output.publishing.finish_publish`). Other files are never touched. A dry
    run changes nothing.

    Every local path acted on is checked first (`transforms.output.ownership.check_own_path`):
    a link, a special file or another device anywhere among them stops the run
    before anything changes.

    With `background` (local folders), the leftovers are first moved aside into
    this run's temporary folder and deleted on a thread while the job runs; the
    caller must `wait()` before it exits.

    With `record` (`pipeline.plan.plan_record`), this run is resumable: its plan.json is written into its
    temporary folder, and the folders of interrupted runs whose plan.json holds the same fingerprint are kept
    (`OldOutputs.resumed`, the newest first) for the job to take their converted chunks from; any other goes
    as a leftover, with one line saying why it is not resumed.

    Raises:
        UserError: a path that this tool would act on is not its own (a link, another device), files named like
            this tool's that no dataset describes, or the dataset that finishing an interrupted publishing left is
            one --if_exists refuses.
    """
    if dry_run:
        return OldOutputs([])
    try:
        return _prepare_output(settings, run_id, background, record)
    except UnsafePath as e:
        raise UserError(str(e)) from None


def _resumable(output_dir: str, stale: list[str], mine: str, record: dict | None) -> list[Earlier]:
    """The interrupted runs among `stale`'s temporary folders whose plan is `record`, the newest first; one line
    for each other run that had converted chunks, saying why it is not resumed."""
    temp = FileSystems.join(output_dir, TEMP_DIR)
    runs: dict[str, bool] = {}  # run id -> whether it holds converted chunks
    for path in stale:
        if path.startswith(temp + "/") and not path.startswith(mine + "/"):
            run, _, rest = path[len(temp) + 1:].partition("/")
            runs[run] = runs.get(run, False) or rest.startswith("done/")
    if record is None:
        return []
    wanted, kept = fingerprint(record), []
    for run in sorted(runs, reverse=True):  # run ids start with their UTC time: the newest first
        folder = run_dir(output_dir, run)
        plan = read_plan(folder)
        if plan is not None and plan["fingerprint"] == wanted and plan["run_id"] == run:
            kept.append(Earlier(run, folder, FileSystems.join(folder, "shards")))
            continue
        if not runs[run]:
            continue  # nothing converted there: nothing to say
        why = (f"it left no readable {PLAN_FILE} (an earlier version's run, or one stopped at its start)"
               if plan is None else plan_differences(plan.get("record") or {}, record))
        _LOG.warning("Not resuming the interrupted run %s in %s: %s; its files are removed and everything is "
                     "converted", run, output_dir, why)
    return kept


def _prepare_output(settings: Settings, run_id: str, background: bool, record: dict | None = None) -> OldOutputs:
    output_dir, local = settings.output_dir, is_local(settings.output_dir)
    temp = os.path.join(output_dir, TEMP_DIR)
    if local and os.path.isdir(output_dir):
        check_own_tree(output_dir, temp)  # no link or mount point among the temporary files
    done, refused = _finish_interrupted_publish(settings)
    if completion_marker(output_dir) is None:
        _check_unclaimed(output_dir)
    mine = run_dir(output_dir, run_id)
    # Only temporary files are leftovers; a complete dataset's own files go when a new run publishes.
    stale = [p for p in temporary_outputs(output_dir) if not p.startswith(mine + "/")]
    resumed = [] if done or refused else _resumable(output_dir, stale, mine, record)
    stale = [p for p in stale if not any(p.startswith(earlier.folder + "/") for earlier in resumed)]
    resumable = record is not None and not (done or refused)
    if not local:
        if resumable:
            write_plan(mine, run_id, record)
        delete_files(stale)  # in parallel batches: a leftover run's thousands of shards are no serial chore
        return OldOutputs(stale, done=done, resumed=resumed)
    check_own_paths(output_dir, [*stale, *dataset_files(output_dir)])  # what this run deletes, now or at the end
    os.makedirs(mine, exist_ok=True)
    check_own_path(output_dir, mine, folder=True)
    if resumable:
        write_plan(mine, run_id, record)
    if done or refused or not (background and stale):
        if stale:
            FileSystems.delete([p for p in stale if os.path.lexists(p)])
        _remove_empty_folders(output_dir, mine)
        if done or refused:  # this run ends here: its own folder goes too
            remove_run_dir(output_dir, run_id)
        if refused:
            raise refused
        return OldOutputs(stale, done=done, resumed=resumed)
    aside = _move_aside(output_dir, run_id, stale, tuple(earlier.run_id for earlier in resumed))
    _remove_empty_folders(output_dir, mine)
    deleting = threading.Thread(target=shutil.rmtree, args=(aside,), kwargs={"ignore_errors": True},
                                name="delete-old-outputs", daemon=True)
    deleting.start()
    return OldOutputs(stale, deleting, done, resumed)


def _check_unclaimed(output_dir: str) -> None:
    """Files under the final names of this tool's files in a folder that holds no dataset of it: no run can be
    proven to have written them (a run's own files are in its temporary folder until it publishes, and a stopped
    publishing, which `_finish_interrupted_publish` finishes, is its plan), so they are never deleted. Those this
    run would publish under the same names, or beside which a reader that globs would read them (shards, index
    files, descriptions), stop the run; others (sources files) are named and left.

    Raises:
        UserError: naming the first such files, and what to do.
    """
    unclaimed = final_outputs(output_dir)
    clash = [p for p in unclaimed if not SOURCES_NAME.fullmatch(relative_to(p, output_dir))]
    if clash:
        names = [relative_to(p, output_dir) for p in clash]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise UserError(f"--output_dir {output_dir} holds no dataset of this tool, but {len(names)} file(s) named "
                        f"as this run names its own ({shown}): they are not this tool's to delete, and the dataset "
                        "would be published over or beside them; move or remove them, or choose an empty folder")
    if unclaimed:
        _LOG.warning("Left %d file(s) in %s that are named like this tool's but belong to no dataset of it: %s",
                     len(unclaimed), output_dir, ", ".join(relative_to(p, output_dir) for p in unclaimed[:5])
                     + (", ..." if len(unclaimed) > 5 else ""))


def _finish_interrupted_publish(settings: Settings) -> tuple[str | None, UserError | None]:
    """Finish the publishing of a run that was stopped inside it, so that its dataset is complete.

    Returns (a message when that dataset is the one this run would make, the same options: nothing is left to
    do then, unless --if_exists=overwrite asks for a new one; the error to stop with, once the leftovers are
    gone, when it was made with other options and --if_exists is not overwrite).
    """
    plan = interrupted_publish(settings.output_dir)
    if plan is None:
        return None, None
    finish_publish(settings.output_dir, plan)
    what = (f"run {plan['run_id']} was stopped while it published its dataset in {settings.output_dir}, and this "
            "run finished publishing it")
    _LOG.warning("%s%s", what[0].upper(), what[1:])
    if settings.if_exists in ("overwrite", "append"):  # an append goes on with the dataset that left
        return None, None
    info = read_existing_info(settings.output_dir) or {}
    differences = option_differences(info.get("options") or {}, settings)
    if differences:
        return None, UserError(f"{what}, but it was made with other options ({'; '.join(differences[:3])}): pass "
                               "--if_exists=overwrite to replace it, or choose another folder")
    files = info.get("files") or {}
    return (f"{what[0].upper()}{what[1:]}: it was made with the same options ({files.get('written', '?')} images), "
            "so there is nothing more to do"), None


def _remove_empty_folders(output_dir: str, mine: str) -> None:
    """Folders this tool made that deleting their files left empty (Beam's temporary folders, other runs')."""
    temp = os.path.join(output_dir, TEMP_DIR)
    for folder in sorted((root for root, _, _ in os.walk(temp)), key=len, reverse=True):
        if folder != temp and not mine.startswith(folder) and not os.listdir(folder):
            os.rmdir(folder)
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if BEAM_TEMP_DIR.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            check_own_path(output_dir, path, folder=True)
            os.rmdir(path)
