"""Detection records (transforms.detection.records): the keys and types the TF Object Detection API reads, parsed
back by TensorFlow with its feature spec (and by Model Garden's TfExampleDecoder when it is installed); the
label map in the OD API's text format."""

from __future__ import annotations

import io

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from PIL import Image

from tests.detection_images import oriented_file
from tests.model_garden import MODEL_GARDEN, model_garden_decoder
from transforms.detection.geometry import PlacedAnnotations, place_annotations
from transforms.detection.objects import Annotation, Box, ImageAnnotations, Segmentation
from transforms.detection.records import build_detection_example, label_map_text
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

tf = pytest.importorskip("tensorflow")

CLASSES = ["red", "green", "blue"]
INDEX = {name: i for i, name in enumerate(CLASSES)}
SHA = "ab" * 32


def od_api_spec() -> dict:
    """The OD API's TfExampleDecoder keys (object_detection/data_decoders/tf_example_decoder.py), with PNG masks."""
    fixed = tf.io.FixedLenFeature
    var = tf.io.VarLenFeature
    return {
        "image/encoded": fixed((), tf.string), "image/format": fixed((), tf.string),
        "image/filename": fixed((), tf.string), "image/key/sha256": fixed((), tf.string),
        "image/source_id": fixed((), tf.string), "image/height": fixed((), tf.int64),
        "image/width": fixed((), tf.int64),
        "image/object/bbox/xmin": var(tf.float32), "image/object/bbox/xmax": var(tf.float32),
        "image/object/bbox/ymin": var(tf.float32), "image/object/bbox/ymax": var(tf.float32),
        "image/object/class/label": var(tf.int64), "image/object/class/text": var(tf.string),
        "image/object/area": var(tf.float32), "image/object/is_crowd": var(tf.int64),
        "image/object/difficult": var(tf.int64), "image/object/mask": var(tf.string),
        "image/segmentation/class/encoded": fixed((), tf.string, default_value=""),
        "image/segmentation/class/format": fixed((), tf.string, default_value=""),
    }


def parse(record: bytes) -> dict:
    parsed = tf.io.parse_single_example(record, od_api_spec())
    return {k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v).numpy() for k, v in parsed.items()}


def semantic_png(size) -> bytes:
    values = np.zeros((size[1], size[0]), np.uint8)
    values[60:220, 40:280] = 2
    out = io.BytesIO()
    image = Image.fromarray(values, "P")
    image.putpalette([255, 255, 255] * 256)  # colours that say nothing: the indices are the ids
    image.save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def converted():
    """A photo stored on its side (EXIF 6), cropped to 64 x 48, its three rectangles as polygons (one a crowd,
    one difficult) and a semantic mask, all in the upright frame."""
    file = oriented_file(6, "JPEG")
    encoded = convert_image(file.data, ImageSettings(width=64, height=48, resize_mode="crop"))._replace(sha256=SHA)
    objects = tuple(
        Annotation(CLASSES[c], Box(*b), is_crowd=c == 1, difficult=c == 2,
                   segmentation=Segmentation(polygons=((b[0], b[1], b[2], b[1], b[2], b[3], b[0], b[3]),)))
        for c, b in file.upright_boxes.items())
    annotations = ImageAnnotations("photos/side.jpg", "/in/photos/side.jpg", "42", objects=objects, frame="upright",
                                   semantic_mask="/in/masks/side.png")
    placed = place_annotations(annotations, encoded.placement, semantic_png((800, 480)))
    assert not placed.problems and len(placed.objects) == 3
    return encoded, placed


def test_the_record_parses_with_the_od_apis_feature_spec(converted):
    encoded, placed = converted
    record = build_detection_example(encoded, placed, INDEX, source_id="42", filename="photos/side.jpg")
    got = parse(record)
    assert got["image/encoded"] == encoded.data and got["image/format"] == b"jpeg"
    assert (got["image/height"], got["image/width"]) == (48, 64)
    assert tf.io.decode_jpeg(got["image/encoded"]).shape == (48, 64, 3)
    assert got["image/filename"] == b"photos/side.jpg" and got["image/source_id"] == b"42"
    assert got["image/key/sha256"] == SHA.encode()
    for side in ("xmin", "ymin", "xmax", "ymax"):
        np.testing.assert_allclose(got[f"image/object/bbox/{side}"], [getattr(o.box, side) for o in placed.objects],
                                   rtol=1e-6)
    assert got["image/object/class/label"].tolist() == [1, 2, 3]  # from 1: the OD API's 0 is the background
    assert got["image/object/class/text"].tolist() == [b"red", b"green", b"blue"]
    assert got["image/object/is_crowd"].tolist() == [0, 1, 0]
    assert got["image/object/difficult"].tolist() == [0, 0, 1]
    np.testing.assert_allclose(got["image/object/area"], [o.mask.sum() for o in placed.objects])
    assert len(got["image/object/mask"]) == 3
    for png, o in zip(got["image/object/mask"], placed.objects, strict=True):
        mask = tf.io.decode_png(png, channels=1).numpy()[:, :, 0]
        assert mask.shape == (48, 64) and set(np.unique(mask)) <= {0, 1}
        np.testing.assert_array_equal(mask, o.mask)
    assert got["image/segmentation/class/format"] == b"png"
    semantic = tf.io.decode_png(got["image/segmentation/class/encoded"], channels=1).numpy()[:, :, 0]
    np.testing.assert_array_equal(semantic, placed.semantic_mask)
    assert set(np.unique(semantic)) == {0, 2}
    # The same image gives the same bytes.
    assert build_detection_example(encoded, placed, INDEX, source_id="42", filename="photos/side.jpg") == record


def test_class_ids_from_zero_and_an_image_without_objects(converted):
    encoded, placed = converted
    got = parse(build_detection_example(encoded, placed, INDEX, source_id="42", filename="a.jpg", first_id=0))
    assert got["image/object/class/label"].tolist() == [0, 1, 2]
    empty = PlacedAnnotations((), (), "stored")
    got = parse(build_detection_example(encoded, empty, INDEX, source_id="7", filename="b.jpg", with_masks=True))
    assert got["image/object/bbox/xmin"].size == 0 and got["image/object/class/label"].size == 0
    assert got["image/object/mask"].size == 0 and got["image/segmentation/class/encoded"] == b""
    record = build_detection_example(encoded, empty, INDEX, source_id="7", filename="b.jpg", with_masks=True)
    assert b"image/object/mask" in record
    assert b"image/object/mask" not in build_detection_example(encoded, empty, INDEX, source_id="7", filename="b.jpg")


def test_what_the_caller_got_wrong_is_a_value_error(converted):
    encoded, placed = converted
    with pytest.raises(ValueError, match="a number as text"):
        build_detection_example(encoded, placed, INDEX, source_id="img-7", filename="a.jpg")
    with pytest.raises(ValueError, match="no sha256"):
        build_detection_example(encoded._replace(sha256=""), placed, INDEX, source_id="7", filename="a.jpg")
    with pytest.raises(ValueError, match=r"not in the label map: \['red'\]"):
        build_detection_example(encoded, placed, {"green": 0, "blue": 1}, source_id="7", filename="a.jpg")
    with pytest.raises(ValueError, match="first_id 2"):
        build_detection_example(encoded, placed, INDEX, source_id="7", filename="a.jpg", first_id=2)
    unmasked = placed._replace(objects=(placed.objects[0]._replace(mask=None), *placed.objects[1:]))
    with pytest.raises(ValueError, match="2 masks for 3 objects"):
        build_detection_example(encoded, unmasked, INDEX, source_id="7", filename="a.jpg")


def test_model_gardens_decoder_reads_the_record(converted):
    decoder_class = model_garden_decoder()
    if decoder_class is None:
        pytest.fail(f"tf-models-official is not in {MODEL_GARDEN}: make venv installs it there (make test does)")
    encoded, placed = converted
    record = build_detection_example(encoded, placed, INDEX, source_id="42", filename="photos/side.jpg")
    decoded = decoder_class(include_mask=True).decode(tf.constant(record))
    assert decoded["source_id"].numpy() == b"42"
    assert decoded["image"].shape == (48, 64, 3)
    boxes = decoded["groundtruth_boxes"].numpy()  # ymin, xmin, ymax, xmax
    np.testing.assert_allclose(boxes, [[o.box.ymin, o.box.xmin, o.box.ymax, o.box.xmax] for o in placed.objects],
                               rtol=1e-6)
    assert decoded["groundtruth_classes"].numpy().tolist() == [1, 2, 3]
    assert decoded["groundtruth_is_crowd"].numpy().tolist() == [False, True, False]
    masks = decoded["groundtruth_instance_masks"].numpy()
    assert masks.shape == (3, 48, 64)
    np.testing.assert_array_equal(masks, np.stack([o.mask for o in placed.objects]).astype(np.float32))


def _label_map_class():
    """The OD API's StringIntLabelMap (object_detection/protos/string_int_label_map.proto: name 1, id 2), built
    from a descriptor, to parse the written text as the OD API's label_map_util does (text_format.Merge)."""
    f = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(name="test_label_map.proto", package="object_detection.protos",
                                                    syntax="proto2")
    item = file_proto.message_type.add(name="StringIntLabelMapItem")
    item.field.add(name="name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    item.field.add(name="id", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    item.field.add(name="display_name", number=3, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    label_map = file_proto.message_type.add(name="StringIntLabelMap")
    label_map.field.add(name="item", number=1, type=f.TYPE_MESSAGE, label=f.LABEL_REPEATED,
                        type_name=".object_detection.protos.StringIntLabelMapItem")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("object_detection.protos.StringIntLabelMap"))


def test_the_label_map_is_the_od_apis_text_format():
    names = ["cat", "dog's toy", 'say "hi"', "back\\slash", "café", "new\nline"]
    text = label_map_text(names)
    assert text.startswith("item {\n  id: 1\n  name: 'cat'\n}\nitem {\n  id: 2\n")
    parsed = text_format.Parse(text, _label_map_class()())
    assert [(item.id, item.name) for item in parsed.item] == list(enumerate(names, 1))
    zero = label_map_text(["cat", "dog"], first_id=0)
    assert zero.startswith("# Class ids from 0")
    assert [(i.id, i.name) for i in text_format.Parse(zero, _label_map_class()()).item] == [(0, "cat"), (1, "dog")]
    with pytest.raises(ValueError):
        label_map_text(["cat"], first_id=2)
