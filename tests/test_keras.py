"""Keras: `reader.make_dataset(..., supervised=True)` plugs into `model.fit`, with what the converter wrote."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest

from pipeline.sample_data import generate_dataset
from tests.conftest import convert, doc_example

SIZE = 16


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """4 classes of 8 images, converted at 16x16 with a validation split: (folder, image_tfrecords.json)."""
    from pipeline import reader

    root = tmp_path_factory.mktemp("keras")
    generate_dataset(str(root / "in"), images_per_class=8, seed=5, min_side=24, max_side=64)
    out = root / "tfrecords"
    assert convert(root / "in", out, f"--image_size={SIZE}", "--validation_split=0.25", "--num_shards=2") == 0
    return out, reader.load_info(str(out))


def _digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


def _written(out) -> list[tuple[int, str]]:
    """(label, pixel digest) of every train record, as the dict reader gives them, sorted."""
    from pipeline import reader

    rows = [(int(e["label"]), _digest(e["image"])) for e in reader.make_dataset(str(out), "train").as_numpy_iterator()]
    return sorted(rows)


def test_default_make_dataset_still_yields_dicts(dataset):
    from pipeline import reader

    out, _ = dataset
    spec = reader.make_dataset(str(out), "train", batch_size=4).element_spec
    assert isinstance(spec, dict)
    assert set(spec) == {"image", "label", "class_name", "height", "width", "source_path", "sha256"}


def test_supervised_gives_image_label_tuples_that_match_what_was_written(dataset):
    import tensorflow as tf

    from pipeline import reader

    out, info = dataset
    ds = reader.make_dataset(str(out), "train", batch_size=4, supervised=True)
    image_spec, label_spec = ds.element_spec
    assert image_spec == tf.TensorSpec([4, SIZE, SIZE, 3], tf.uint8)
    assert label_spec == tf.TensorSpec([4], tf.int64)

    rows = [(int(label), _digest(image)) for label, image in
            ((label, image) for images, labels in reader.make_dataset(str(out), "train", supervised=True)
             .batch(1).as_numpy_iterator() for image, label in zip(images, labels, strict=True))]
    assert sorted(rows) == _written(out)
    # Labels are the written ones: their counts are image_tfrecords.json's class counts, by id.
    counts = Counter(info["class_names"][label] for label, _ in rows)
    assert counts == Counter(info["splits"]["train"]["class_counts"])
    assert len(rows) == info["splits"]["train"]["records"]


def test_one_hot_and_scale(dataset):
    import tensorflow as tf

    from pipeline import reader

    out, info = dataset
    k = info["num_classes"]
    assert k == 4
    ds = reader.make_dataset(str(out), "train", batch_size=4, supervised=True, one_hot=True, scale=True)
    assert ds.element_spec == (tf.TensorSpec([4, SIZE, SIZE, 3], tf.float32), tf.TensorSpec([4, k], tf.float32))

    rows = []
    for images, labels in reader.make_dataset(str(out), "train", supervised=True, one_hot=True,
                                              scale=True).as_numpy_iterator():
        assert images.dtype == np.float32 and images.shape == (SIZE, SIZE, 3)
        assert images.min() >= 0.0 and images.max() <= 1.0
        # Each label is a one-hot vector: one 1.0, the rest 0.0.
        assert labels.dtype == np.float32 and labels.shape == (k,)
        assert sorted(labels.tolist()) == [0.0] * (k - 1) + [1.0]
        # The scaled pixels are the written uint8 pixels / 255, exactly.
        pixels = np.rint(images * 255.0).astype(np.uint8)
        np.testing.assert_allclose(images, pixels.astype(np.float32) / 255.0, atol=1e-7)
        rows.append((int(np.argmax(labels)), _digest(pixels)))
    assert sorted(rows) == _written(out)
    assert max(images.max() for images, _ in reader.make_dataset(  # not all black: the scale is not 1/65025
        str(out), "train", supervised=True, scale=True).as_numpy_iterator()) > 0.5


def test_scale_needs_decoded_images(dataset):
    from pipeline import reader

    out, _ = dataset
    with pytest.raises(ValueError, match="scale=True needs decode=True"):
        reader.make_dataset(str(out), "train", decode=False, scale=True)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("one_hot", [False, True])
def test_model_fit_trains_on_the_written_dataset(dataset, one_hot):
    import tensorflow as tf

    from pipeline import reader

    out, info = dataset
    tf.keras.utils.set_random_seed(0)
    train = reader.make_dataset(str(out), "train", batch_size=4, shuffle_buffer=64, repeat=True, supervised=True,
                                one_hot=one_hot, scale=one_hot)
    validation = reader.make_dataset(str(out), "validation", batch_size=2, supervised=True, one_hot=one_hot,
                                     scale=one_hot, drop_remainder=False)
    model = tf.keras.Sequential([
        tf.keras.Input((SIZE, SIZE, 3)),
        *([] if one_hot else [tf.keras.layers.Rescaling(1 / 255)]),  # uint8 images without scale=True
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(info["num_classes"], activation="softmax"),
    ])
    loss = "categorical_crossentropy" if one_hot else "sparse_categorical_crossentropy"
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    history = model.fit(train, validation_data=validation, steps_per_epoch=5, epochs=2, verbose=0)
    assert isinstance(history, tf.keras.callbacks.History)
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
    assert len(history.history["val_loss"]) == 2 and all(np.isfinite(history.history["val_loss"]))


@pytest.mark.timeout(300)
def test_readme_model_fit_example_runs(dataset, monkeypatch):
    """The README's model.fit example, run as written in a folder holding its tfrecords/ dataset."""
    out, _ = dataset
    blocks = [doc_example("README.md", "model.fit(")]
    assert '"tfrecords/"' in blocks[0]
    monkeypatch.chdir(out.parent)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    history = namespace["history"]
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
