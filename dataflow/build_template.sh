#!/usr/bin/env bash
# Build the Dataflow Flex Template of image-tfrecords: the container image (template launcher and
# workers, from dataflow/Dockerfile) and the template spec file in Cloud Storage.
#
#   export PROJECT=my-project REGION=us-central1 BUCKET=my-bucket
#   dataflow/build_template.sh            # image, then gs://$BUCKET/templates/image-tfrecords.json
#   dataflow/build_template.sh image      # the image only, e.g. for ./run_dataflow.sh --sdk_container_image=IMAGE
#   dataflow/build_template.sh --dry_run  # print the build context and the commands, run nothing
#
# Environment:
#   PROJECT, REGION, BUCKET   required
#   REPOSITORY                Artifact Registry Docker repository in $REGION (default: image-tfrecords)
#   TAG                       image tag (default: the code's identity, <version>-<code hash>, which the launcher
#                             checks against its own; another tag is checked by the job's workers instead)
#   BUILDER                   cloudbuild (default: no local Docker needed) or docker (build and push locally)
#   TEMPLATE                  spec file (default: gs://$BUCKET/templates/image-tfrecords.json)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

fail() {
  echo "error: $*" >&2
  exit 2
}

what=all
dry_run=false
for arg in "$@"; do
  case "$arg" in
    all | image) what="$arg" ;;
    --dry_run) dry_run=true ;;
    -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) fail "unknown argument $arg: give all, image or --dry_run" ;;
  esac
done

missing=()
for name in PROJECT REGION BUCKET; do
  [[ -n "${!name:-}" ]] || missing+=("$name")
done
list="$(IFS=,; echo "${missing[*]}")"
((${#missing[@]} == 0)) || fail "set ${list//,/, } in the environment, e.g. export PROJECT=my-project REGION=us-central1 BUCKET=my-bucket"
builder="${BUILDER:-cloudbuild}"
[[ "$builder" == cloudbuild || "$builder" == docker ]] || fail "BUILDER=$builder: use cloudbuild or docker"
if ! $dry_run; then
  command -v gcloud >/dev/null || fail "gcloud is not installed: see https://cloud.google.com/sdk/docs/install"
  [[ "$builder" != docker ]] || command -v docker >/dev/null || fail "docker is not installed: use BUILDER=cloudbuild"
fi

bucket="${BUCKET:-}"
bucket="${bucket#gs://}"
bucket="${bucket%/}"
repository="${REPOSITORY:-image-tfrecords}"
# The default tag declares the code (version-codehash, pipeline/code_version.py): the launcher compares it with
# its own before it submits a job, so that workers never run other code than the launcher planned with.
tag="${TAG:-$(python3 "$root/pipeline/code_version.py" "$root" 2>/dev/null || date -u +%Y%m%d-%H%M%S)}"
image="$REGION-docker.pkg.dev/$PROJECT/$repository/image-tfrecords:$tag"
template="${TEMPLATE:-gs://$bucket/templates/image-tfrecords.json}"

# A small build context: only what the image needs (never .venv, tests or data).
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$root/setup.py" "$root/README.md" "$root/dataflow/launch.py" "$context/"
cp "$root/dataflow/Dockerfile" "$context/Dockerfile"
tar -C "$root" --exclude=__pycache__ --exclude='*.pyc' -cf - pipeline transforms | tar -C "$context" -xf -

run() {
  echo "+ $*" >&2
  $dry_run || "$@"
}

if $dry_run; then
  echo "build context:" >&2
  (cd "$context" && find . -type f | sort | sed 's/^/  /') >&2
fi

if [[ "$builder" == cloudbuild ]]; then
  run gcloud builds submit "$context" --project="$PROJECT" --region="$REGION" --tag="$image"
else
  run docker build --tag="$image" "$context"
  run docker push "$image"
fi
echo "image: $image"

if [[ "$what" == all ]]; then
  run gcloud dataflow flex-template build "$template" --project="$PROJECT" --image="$image" \
    --sdk-language=PYTHON --metadata-file="$root/dataflow/metadata.json"
  echo "template: $template"
  cat <<EOF
Run it (workers use the same image, so they start with everything installed):
  gcloud dataflow flex-template run "image-tfrecords-\$(date -u +%Y%m%d-%H%M%S)" \\
    --project=$PROJECT --region=$REGION --template-file-gcs-location=$template \\
    --temp-location=gs://$bucket/dataflow/temp --staging-location=gs://$bucket/dataflow/staging \\
    --parameters=sdk_container_image=$image,input_dir=gs://$bucket/photos,output_dir=gs://$bucket/tfrecords/{date},labels_file=gs://$bucket/labels.txt
EOF
fi
