"""Build serialized `tf.train.Example` records, and describe their keys, without importing TensorFlow.

Workers only need to *write* Examples. Importing TensorFlow costs each worker
process several seconds and about 600 MB, so the Example messages are declared
here from the same schema as TensorFlow's `example.proto` (same package, names
and field numbers, hence the same bytes on the wire), in a private descriptor
pool so they never clash with TensorFlow's own classes when both are loaded.
Tests parse the bytes with TensorFlow to prove the equivalence.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from transforms.base.dataset_format import (
    DETECTION_INSTANCE_MASK,
    DETECTION_OBJECT_FIELDS,
    DETECTION_TFDS_OBJECTS,
    MULTI_LABEL_FIELDS,
    detection_fields,
    record_fields,
)


def _example_classes():
    """Message classes for tensorflow.Example and its parts, built from a descriptor."""
    f = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="image_tfrecords/tf_example.proto", package="tensorflow", syntax="proto3"
    )

    def message(name, fields, nested=(), oneofs=()):
        msg = file_proto.message_type.add(name=name)
        for oneof in oneofs:
            msg.oneof_decl.add(name=oneof)
        for nested_msg in nested:
            msg.nested_type.add().CopyFrom(nested_msg)
        for field in fields:
            msg.field.add().CopyFrom(field)
        return msg

    def field(name, number, type_, label=f.LABEL_OPTIONAL, type_name=None, oneof_index=None):
        fd = f(name=name, number=number, type=type_, label=label, json_name=name)
        if type_name:
            fd.type_name = type_name
        if oneof_index is not None:
            fd.oneof_index = oneof_index
        return fd

    repeated = f.LABEL_REPEATED
    message("BytesList", [field("value", 1, f.TYPE_BYTES, repeated)])
    message("FloatList", [field("value", 1, f.TYPE_FLOAT, repeated)])
    message("Int64List", [field("value", 1, f.TYPE_INT64, repeated)])
    message(
        "Feature",
        [
            field("bytes_list", 1, f.TYPE_MESSAGE, type_name=".tensorflow.BytesList", oneof_index=0),
            field("float_list", 2, f.TYPE_MESSAGE, type_name=".tensorflow.FloatList", oneof_index=0),
            field("int64_list", 3, f.TYPE_MESSAGE, type_name=".tensorflow.Int64List", oneof_index=0),
        ],
        oneofs=["kind"],
    )
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add().CopyFrom(field("key", 1, f.TYPE_STRING))
    entry.field.add().CopyFrom(field("value", 2, f.TYPE_MESSAGE, type_name=".tensorflow.Feature"))
    message(
        "Features",
        [field("feature", 1, f.TYPE_MESSAGE, repeated, type_name=".tensorflow.Features.FeatureEntry")],
        nested=[entry],
    )
    message("Example", [field("features", 1, f.TYPE_MESSAGE, type_name=".tensorflow.Features")])

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _example_classes()


def record_id(source_path: str) -> str:
    """A record's `id` (the kaggle schema's key): its file's name without the extension ('cats/0042.jpg' -> '0042')."""
    return posixpath.splitext(posixpath.basename(source_path))[0]


def build_example(
    *,
    image: bytes,
    image_format: str,
    label: int | None,
    class_name: str,
    height: int,
    width: int,
    source_path: str,
    schema: str = "default",
    sha256: str = "",
    labels: Sequence[int] | None = None,
    label_names: Sequence[str] = (),
    extras: tuple = (),
) -> bytes:
    """A serialized tf.train.Example holding one image and its label under `schema`'s keys.

    With `label` None (an unlabeled set, --unlabeled) it holds no label and no class_name, and an `id`
    (`record_fields`).
    With `labels` (--multi_label) the label key holds that list of class ids (an int64_list of any length,
    empty for an image of no class) and the class_name key the list `label_names`, instead of one each.
    `extras`: typed extra features, ((key, dtype, values), ...) with dtype int64 (an int64_list), float (a
    float_list) or string (a bytes_list of UTF-8); see transforms.base.features.
    """
    values = {
        "image": image,
        "format": image_format,
        "label": label,
        "class_name": class_name,
        "height": height,
        "width": width,
        "source_path": source_path,
        "sha256": sha256,
        "id": record_id(source_path),
    }
    example = Example()
    features = example.features.feature
    for field_name, (key, dtype) in record_fields(schema, unlabeled=label is None).items():
        value = values[field_name]
        if labels is not None and field_name in ("label", "class_name"):
            if field_name == "label":
                features[key].int64_list.value.extend(labels)
            else:
                features[key].bytes_list.value.extend(name.encode("utf-8") for name in label_names)
            continue
        if dtype == "int64":
            features[key].int64_list.value.append(value)
        elif dtype == "string":
            features[key].bytes_list.value.append(value.encode("utf-8"))
        else:
            features[key].bytes_list.value.append(value)
    for key, dtype, items in extras:
        feature = features[key]
        if dtype == "int64":
            feature.int64_list.value.extend(items)
        elif dtype == "float":
            feature.float_list.value.extend(items)
        else:
            feature.bytes_list.value.extend(v.encode("utf-8") for v in items)
    # Map entries in key order: the same image gives the same bytes in any process (map order is otherwise
    # free to differ between processes, and so would the shards).
    return example.SerializeToString(deterministic=True)




def detection_feature_description(instance_masks: bool = False, semantic_masks: bool = False
                                  ) -> dict[str, dict[str, object]]:
    """A detection dataset's keys (`dataset_format.detection_fields`) as {key: {dtype, shape, field}}: the object
    fields and the instance masks lists of one value per object (shape [-1]), TFDS's objects/bbox four per object
    ([-1, 4]), the rest one value each."""
    lists = {*DETECTION_OBJECT_FIELDS, *DETECTION_INSTANCE_MASK, *DETECTION_TFDS_OBJECTS}
    return {key: {"dtype": dtype if dtype in ("int64", "float") else "string",
                  "shape": ([-1, 4] if field_name == "tfds_bbox" else [-1]) if field_name in lists else [],
                  "field": field_name}
            for field_name, (key, dtype) in detection_fields(instance_masks, semantic_masks).items()}


def feature_description(schema: str = "default", multi_label: bool = False, extras: dict | None = None,
                        unlabeled: bool = False) -> dict[str, dict[str, object]]:
    """The written keys as JSON-friendly {key: {dtype, shape, field}}; image_tfrecords.json's "features" holds this.

    With `multi_label` the label and class_name keys have shape [-1]: a list of any length (a VarLenFeature).
    `extras`: the typed extra features' own descriptions (transforms.base.features.describe), listed after the schema's.
    `unlabeled`: an unlabeled set's keys (`record_fields`).
    """
    return {
        **{key: {"dtype": "int64" if dtype == "int64" else "string",
                 "shape": [-1] if multi_label and field_name in MULTI_LABEL_FIELDS else [], "field": field_name}
           for field_name, (key, dtype) in record_fields(schema, unlabeled).items()},
        **(extras or {}),
    }
