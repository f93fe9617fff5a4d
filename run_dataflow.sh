#!/usr/bin/env bash
# Submit the image-to-TFRecord conversion to Google Cloud Dataflow.
#
#   export PROJECT=my-project REGION=us-central1 BUCKET=my-bucket
#   ./run_dataflow.sh --input_dir=gs://my-bucket/photos --output_dir=gs://my-bucket/tfrecords [options]
#   ./run_dataflow.sh --manifest=gs://my-bucket/boxes.csv --output_dir=gs://my-bucket/boxes --task=detection
#
# Environment:
#   PROJECT, REGION, BUCKET            required; temp and staging files go under gs://$BUCKET/dataflow/
#   SERVICE_ACCOUNT                    optional: the workers' service account e-mail
#   MACHINE_TYPE                       optional: worker machine type, e.g. n2-standard-4
#   MAX_WORKERS                        optional: upper bound for autoscaling
#   PYTHON                             optional: the interpreter (default: .venv/bin/python next to this script)
#   BENCHMARK_STEPS                    optional: batches read per stage by --benchmark (default 200; 0 reads the
#                                      whole train split, once per stage, onto this machine)
#   STORAGE_EMULATOR_HOST              for tests only: use a GCS emulator, with authentication off
#
# Options of this script:
#   --dry_run     build the package from setup.py, translate and stage the job, but do not submit it
#   --benchmark   after a successful job, run: python -m pipeline.benchmark --dataset_dir=<output_dir>
#                 --steps=$BENCHMARK_STEPS (a bounded sample: the reads come to this machine)
#   -h, --help    this text
# Every other option goes to `python -m pipeline.main` unchanged (see README.md, "Options"), for example
#   --sdk_container_image=IMAGE  workers run the image built by dataflow/build_template.sh image, which has
#                                this package installed (then no --setup_file is passed)
#   --no_wait                    return once the job is submitted
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"

usage() {
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

fail() {
  echo "error: $*" >&2
  exit 2
}

input_dir=""
output_dir=""
manifest=""
dry_run=false
benchmark=false
no_wait=false
job_name=""
worker_image=""
passthrough=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --input_dir=*) input_dir="${1#*=}" ;;
    --output_dir=*) output_dir="${1#*=}" ;;
    --manifest=*) manifest="${1#*=}"; passthrough+=("$1") ;;
    --input_dir | --output_dir | --manifest)
      (($# >= 2)) || fail "$1 needs a value: $1=gs://BUCKET/folder"
      case "$1" in
        --input_dir) input_dir="$2" ;;
        --output_dir) output_dir="$2" ;;
        *) manifest="$2"; passthrough+=("--manifest=$2") ;;
      esac
      shift ;;
    --dry_run | --dry_run=true | --dry_run=True) dry_run=true ;;
    --benchmark) benchmark=true ;;
    --no_wait | --no_wait=true | --no_wait=True) no_wait=true; passthrough+=("--no_wait") ;;
    --job_name=*) job_name="${1#*=}" ;;
    --sdk_container_image=*) worker_image="${1#*=}"; passthrough+=("$1") ;;
    --runner=* | --temp_location=* | --staging_location=* | --setup_file=* | --project=* | --region=*)
      fail "${1%%=*} is set by this script (from PROJECT, REGION, BUCKET); run python -m pipeline.main directly to choose it" ;;
    *) passthrough+=("$1") ;;
  esac
  shift
done

# Prerequisites, all reported at once.
problems=()
if [[ ! -x "$python" ]]; then
  problems+=("no Python at $python: run 'make venv' in $here first, or set PYTHON to the interpreter that has this package installed")
fi
missing=()
for name in PROJECT REGION BUCKET; do
  [[ -n "${!name:-}" ]] || missing+=("$name")
done
if ((${#missing[@]})); then
  list="$(IFS=,; echo "${missing[*]}")"
  problems+=("set ${list//,/, } in the environment, e.g. export PROJECT=my-project REGION=us-central1 BUCKET=my-bucket")
fi
if [[ -z "$input_dir" && -z "$manifest" ]]; then
  problems+=("--input_dir is required: the gs:// folder of class folders (or of a detection export), or give --manifest=gs://BUCKET/list.csv")
elif [[ -n "$input_dir" && "$input_dir" != gs://* ]]; then
  problems+=("--input_dir $input_dir is not a gs:// path; Dataflow workers cannot read local files: copy it first with gcloud storage cp -r $input_dir gs://\$BUCKET/")
fi
# --manifest: one file, a glob, or several separated by commas; each on Cloud Storage.
IFS=, read -r -a manifest_entries <<< "$manifest"
for entry in "${manifest_entries[@]+"${manifest_entries[@]}"}"; do
  if [[ "$entry" != gs://* ]]; then
    problems+=("--manifest $entry is not a gs:// path; Dataflow workers cannot read local files: copy it first with gcloud storage cp $entry gs://\$BUCKET/ (and its images)")
  fi
done
if [[ -z "$output_dir" ]]; then
  problems+=("--output_dir is required: the gs:// folder to write the dataset to")
elif [[ "$output_dir" != gs://* ]]; then
  problems+=("--output_dir $output_dir is not a gs:// path: Dataflow workers can only write to Cloud Storage")
fi
if [[ -n "${MAX_WORKERS:-}" && ! "$MAX_WORKERS" =~ ^[1-9][0-9]*$ ]]; then
  problems+=("MAX_WORKERS=$MAX_WORKERS is not a positive number of workers")
fi
steps="${BENCHMARK_STEPS:-200}"
if $benchmark && [[ ! "$steps" =~ ^[0-9]+$ ]]; then
  problems+=("BENCHMARK_STEPS=$steps is not a number of batches: give a whole number (0 reads the whole split)")
fi
if $benchmark && $dry_run; then
  problems+=("--benchmark needs a finished job, and --dry_run submits none: drop one of them")
fi
if $benchmark && $no_wait; then
  problems+=("--benchmark needs to wait for the job, and --no_wait does not: drop one of them")
fi
if ((${#problems[@]})); then
  for problem in "${problems[@]}"; do
    echo "error: $problem" >&2
  done
  exit 2
fi

bucket="${BUCKET:-}"
bucket="${bucket#gs://}"
bucket="${bucket%/}"
if [[ -z "$job_name" ]]; then
  # Dataflow job names: lower-case letters, digits and hyphens; unique per run.
  job_name="image-tfrecords-$(date -u +%Y%m%d-%H%M%S)-$(printf '%04x' $((RANDOM % 65536)))"
fi

args=(
  --runner=DataflowRunner
  --project="$PROJECT"
  --region="$REGION"
  --job_name="$job_name"
  --temp_location="gs://$bucket/dataflow/temp"
  --staging_location="gs://$bucket/dataflow/staging"
  --output_dir="$output_dir"
)
# Without --input_dir, a --manifest's relative paths are below its own folder.
[[ -n "$input_dir" ]] && args+=(--input_dir="$input_dir")
# Workers install this package from setup.py, unless their container (dataflow/Dockerfile) has it already.
[[ -n "$worker_image" ]] || args+=(--setup_file="$here/setup.py")
[[ -n "${SERVICE_ACCOUNT:-}" ]] && args+=(--service_account_email="$SERVICE_ACCOUNT")
[[ -n "${MACHINE_TYPE:-}" ]] && args+=(--machine_type="$MACHINE_TYPE")
[[ -n "${MAX_WORKERS:-}" ]] && args+=(--max_num_workers="$MAX_WORKERS")
$dry_run && args+=(--dry_run=True)
if [[ -n "${STORAGE_EMULATOR_HOST:-}" ]]; then
  echo "note: STORAGE_EMULATOR_HOST=$STORAGE_EMULATOR_HOST: using that GCS emulator, without credentials" >&2
  args+=(--no_auth)
fi
args+=("${passthrough[@]+"${passthrough[@]}"}")

cd "$here"
echo "Job $job_name: ${input_dir:-$manifest} -> $output_dir (project $PROJECT, region $REGION)" >&2
status=0
"$python" -m pipeline.main "${args[@]}" || status=$?
if ((status != 0)); then
  exit "$status"
fi

if $benchmark; then
  echo "Benchmarking reads of $output_dir (at most $steps batches per stage; BENCHMARK_STEPS=0 reads the whole split)" >&2
  "$python" -m pipeline.benchmark --dataset_dir="$output_dir" --steps="$steps"
fi
