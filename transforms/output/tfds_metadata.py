"""TensorFlow Datasets' metadata for a converted folder, written with plain json (no TensorFlow on the workers).

With these files `tfds.builder_from_directory(output_dir)` loads the dataset as it is:

    dataset_info.json       TFDS's DatasetInfo proto as JSON: the splits with their shard lengths and
                            bytes, where the shards are ({SPLIT}-{SHARD_X_OF_Y}.tfrecord) and the
                            supervised keys (image, label)
    features.json           TFDS's feature config: the image as an `Image` of the stored size (None x None
                            when the size varies), the label as a `ClassLabel`, the other keys as `Text`
                            and `Scalar`; typed extra features (--features) as `Scalar`, `Text`, or a
                            `Tensor` of shape (N,) or (None,) for lists
    <label>.labels.txt      the `ClassLabel`'s names (label.labels.txt, or image-class-label.labels.txt
                            for --schema=tf_slim)

A detection dataset's features.json (`detection_features_json`) is TFDS's view of its records: `image` (the Image
at image/encoded, filename, source_id, ... as Text and Scalar) and `objects`, a Sequence of {bbox: BBoxFeature,
label: ClassLabel, is_crowd, is_difficult: bool}: the keys objects/... every detection record holds beside the
OD API's (transforms/detection/records.py), the names in objects-label.labels.txt. No supervised keys; masks are
not among TFDS's features (the OD API's PNGs stay readable by the reader).

The formats are TFDS 4.x's (`DatasetInfo.write_to_directory`, `FeatureConnector.save_config`); the tests
load what these functions write with TFDS itself. TFDS reads uncompressed shards named by a template
only: for gzip shards, or names it cannot template, `tfds_files` gives no files and the reason why.
"""

from __future__ import annotations

from transforms.base.dataset_format import (
    DETECTION,
    DETECTION_OBJECT_FIELDS,
    DETECTION_TFDS_OBJECTS,
    FEATURES_FILE,
    MULTI_LABEL_FIELDS,
    SCHEMAS,
    SHARD_FORMATS,
    TFDS_INFO_FILE,
    TFRECORD,
    record_fields,
    tfds_labels_file,
    tfds_shard_template,
)

DATASET_NAME = "image_tfrecords"
DATASET_VERSION = "1.0.0"

_PREFIX = "tensorflow_datasets.core.features."
_CLASSES = {
    "dict": _PREFIX + "features_dict.FeaturesDict",
    "image": _PREFIX + "image_feature.Image",
    "label": _PREFIX + "class_label_feature.ClassLabel",
    "text": _PREFIX + "text_feature.Text",
    "scalar": _PREFIX + "scalar.Scalar",
    "tensor": _PREFIX + "tensor_feature.Tensor",
    "sequence": _PREFIX + "sequence_feature.Sequence",
    "bbox": _PREFIX + "bounding_boxes.BBoxFeature",
}
_TFDS_DTYPES = {"int64": "int64", "float": "float32", "string": "string"}


def _extra_leaf(feature) -> dict:
    """A typed extra feature's config: a Scalar or Text (one value), a Tensor of shape [N] or [None] (a list)."""
    dtype = _TFDS_DTYPES[feature.dtype]
    if feature.length == 0:
        if feature.dtype == "string":
            return {"pythonClassName": _CLASSES["text"], "text": {}}
        return {"pythonClassName": _CLASSES["scalar"], "tensor": {"shape": {}, "dtype": dtype, "encoding": "none"}}
    dims = ["-1"] if feature.length is None else [str(feature.length)]
    return {"pythonClassName": _CLASSES["tensor"],
            "tensor": {"shape": {"dimensions": dims}, "dtype": dtype, "encoding": "none"}}


def _sequence(feature: dict) -> dict:
    """A Sequence (any length) of `feature`: how --multi_label's label (ClassLabel) and class_name (Text) read."""
    return {"pythonClassName": _CLASSES["sequence"], "sequence": {"feature": feature, "length": "-1"}}


def _leaf(field_name: str, dtype: str, image_info: dict, num_classes: int, multi_label: bool = False) -> dict:
    """One feature's config, as `FeatureConnector.to_proto` gives it in JSON."""
    if multi_label and field_name in MULTI_LABEL_FIELDS:
        return _sequence(_leaf(field_name, dtype, image_info, num_classes))
    if field_name == "image":
        height, width = image_info.get("height"), image_info.get("width")
        fixed = image_info.get("fixed_size") and height and width
        dims = [str(height), str(width)] if fixed else ["-1", "-1"]
        return {"pythonClassName": _CLASSES["image"],
                "image": {"shape": {"dimensions": dims + [str(image_info.get("channels", 3))]},
                          "dtype": "uint8", "encodingFormat": image_info.get("format", "jpeg")}}
    if field_name == "label":
        return {"pythonClassName": _CLASSES["label"], "classLabel": {"numClasses": str(num_classes)}}
    if dtype == "int64":
        return {"pythonClassName": _CLASSES["scalar"],
                "tensor": {"shape": {}, "dtype": "int64", "encoding": "none"}}
    return {"pythonClassName": _CLASSES["text"], "text": {}}


def _nest(schema: str, unlabeled: bool = False) -> dict:
    """The written keys as a nested dict of field names: 'image/class/label' -> {'image': {'class': {'label': ...}}}.

    TFDS flattens nested features with '/', so nested dicts give exactly the keys this tool writes.
    A key that is both a feature and a parent of others ('image' and 'image/encoded') cannot be nested.
    `unlabeled`: an unlabeled set's keys (no label, an id: `transforms.base.examples.record_fields`).
    """
    return _nest_fields(record_fields(schema, unlabeled), f"schema {schema!r}")


def _nest_fields(fields: dict, what: str) -> dict:
    """`fields` ({field: (key, dtype)}) as a nested dict of field names (`_nest`); `what` names them in errors."""
    tree: dict = {}
    for field_name, (key, dtype) in fields.items():
        *parents, leaf = key.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{what}: key {key!r} is below another feature")
        if leaf in node:
            raise ValueError(f"{what}: key {key!r} is also a parent of other keys")
        node[leaf] = (field_name, dtype)
    return tree


def _features_content(tree: dict, image_info: dict, num_classes: int, multi_label: bool = False) -> dict:
    features = {}
    for name, node in tree.items():
        if isinstance(node, dict):
            features[name] = {"pythonClassName": _CLASSES["dict"],
                              "featuresDict": _features_content(node, image_info, num_classes, multi_label)}
        else:
            features[name] = _leaf(*node, image_info, num_classes, multi_label)
    return {"features": features}


def features_json(schema: str, image_info: dict, num_classes: int, multi_label: bool = False,
                  features: tuple = (), unlabeled: bool = False) -> dict:
    """TFDS's features.json: the top-level FeaturesDict of the written keys, as `FeatureConnector.save_config`.

    With `multi_label` the label is a Sequence of ClassLabel and class_name a Sequence of Text (lists).
    `features`: the typed extra features (transforms.base.features.FeatureType), each a top-level key of its own.
    `unlabeled` (--unlabeled): no ClassLabel, the id a Text.
    """
    content = _features_content(_nest(schema, unlabeled), image_info, num_classes, multi_label)
    for feature in features:
        content["features"][feature.name] = _extra_leaf(feature)
    return {"pythonClassName": _CLASSES["dict"], "featuresDict": content}


def _detection_object(field_name: str, num_classes: int) -> dict:
    """One of TFDS's per-object features (DETECTION_TFDS_OBJECTS), as it reads inside the `objects` Sequence."""
    if field_name == "tfds_bbox":  # 4 float32 per object under one key, [ymin, xmin, ymax, xmax] normalised
        return {"pythonClassName": _CLASSES["bbox"],
                "boundingBox": {"bboxFormat": "REL_YXYX", "dtype": "float32", "shape": {"dimensions": ["4"]}}}
    if field_name == "tfds_label":
        return {"pythonClassName": _CLASSES["label"], "classLabel": {"numClasses": str(num_classes)}}
    # is_crowd, is_difficult: stored as int64 0/1, read as bool as TFDS's coco and voc give them
    return {"pythonClassName": _CLASSES["scalar"], "tensor": {"shape": {}, "dtype": "bool", "encoding": "none"}}


def detection_features_json(image_info: dict, num_classes: int) -> dict:
    """TFDS's features.json of detection records: `image` (every image key: the Image at image/encoded, the other
    keys as Text and Scalar, nested as they are written) and `objects`, a Sequence of TFDS's per-object keys."""
    image_keys = {field: entry for field, entry in SCHEMAS[DETECTION].items() if field not in DETECTION_OBJECT_FIELDS}
    content = _features_content(_nest_fields(image_keys, "detection records"), image_info, num_classes)
    objects = {key.split("/", 1)[1]: _detection_object(field_name, num_classes)
               for field_name, (key, _) in DETECTION_TFDS_OBJECTS.items()}
    content["features"]["objects"] = _sequence({"pythonClassName": _CLASSES["dict"],
                                                "featuresDict": {"features": objects}})
    return {"pythonClassName": _CLASSES["dict"], "featuresDict": content}


def file_format(splits: dict) -> str:
    """The shards' extension (tfrecord, array_record): the first shard's; tfrecord when there is none."""
    for info in splits.values():
        for shard in info["shards"]:
            return shard["file"].rpartition(".")[2]
    return TFRECORD


def _template_name(split: str, index: int, count: int, extension: str) -> str:
    return tfds_shard_template(extension).format(SPLIT=split, SHARD_X_OF_Y=f"{index:05d}-of-{count:05d}")


def unsupported(splits: dict, compression: str) -> str | None:
    """Why TFDS cannot read these shards, None when it can."""
    if compression != "none":
        return (f"TFDS reads uncompressed TFRecord shards only, and these are {compression}-compressed: "
                "convert with --compression=none to load the folder with tfds.builder_from_directory")
    extension = file_format(splits)
    if extension not in SHARD_FORMATS:
        extension = TFRECORD  # the message below shows the names TFDS would find
    template = tfds_shard_template(extension)
    for split, info in splits.items():
        names = [shard["file"] for shard in info["shards"]]
        expected = [_template_name(split, i, len(names), extension) for i in range(len(names))]
        if names != expected:
            return (f"TFDS finds shards by the template {template} (e.g. {expected[0] if expected else '-'}), "
                    f"and split {split!r} has other names ({names[0] if names else 'none'}): convert with the "
                    "default shard names to load the folder with tfds.builder_from_directory")
    return None


def dataset_info_json(splits: dict, schema: str, description: str = "", unlabeled: bool = False) -> dict:
    """TFDS's dataset_info.json (the DatasetInfo proto in JSON), for splits as image_tfrecords.json lists them;
    an unlabeled set (`unlabeled`) has no supervised keys."""
    keys = SCHEMAS[schema]
    extension = file_format(splits)
    info = {
        "name": DATASET_NAME,
        "version": DATASET_VERSION,
        "description": description,
        "fileFormat": SHARD_FORMATS[extension].tfds_format if extension in SHARD_FORMATS else TFRECORD,
        "moduleName": "image_tfrecords",
        "splits": [
            {
                "name": split,
                "shardLengths": [str(shard["records"]) for shard in info["shards"]],
                "numBytes": str(sum(shard["bytes"] for shard in info["shards"])),
                "filepathTemplate": tfds_shard_template(extension),
            }
            for split, info in splits.items()
        ],
    }
    image, label = keys["image"][0], keys["label"][0]
    if "/" not in image + label and not unlabeled:  # TFDS 4.9 looks supervised keys up at the top level only
        info["supervisedKeys"] = {"tuple": {"items": [{"featureKey": image}, {"featureKey": label}]}}
    return info


def tfds_files(splits: dict, schema: str, image_info: dict, class_names: list[str], compression: str,
               description: str = "", multi_label: bool = False, features: tuple = (), unlabeled: bool = False
               ) -> tuple[dict[str, str], str | None]:
    """{file name: text} of TFDS's files for this dataset, in the order to write them, and None; or ({}, why not).

    An unlabeled set (`unlabeled`, --unlabeled) has no ClassLabel, hence no labels file."""
    import json

    why_not = unsupported(splits, compression)
    if why_not:
        return {}, why_not
    labels = {} if unlabeled else {tfds_labels_file(schema): "".join(f"{name}\n" for name in class_names)}
    config = (detection_features_json(image_info, len(class_names)) if schema == DETECTION else
              features_json(schema, image_info, len(class_names), multi_label, features=features, unlabeled=unlabeled))
    return {
        **labels,
        FEATURES_FILE: json.dumps(config, indent=4, sort_keys=True),
        TFDS_INFO_FILE: json.dumps(dataset_info_json(splits, schema, description, unlabeled), indent=2) + "\n",
    }, None
