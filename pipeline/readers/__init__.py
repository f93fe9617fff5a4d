"""The read-side tools: read, check, look at and time a converted dataset, with TensorFlow and without Beam.

    reader        tf.data pipelines from image_tfrecords.json (`from pipeline import reader` still works)
    verify        python -m pipeline.verify DATASET: checks it end to end
    preview       python -m pipeline.preview DATASET: a contact sheet of sample images
    benchmark     python -m pipeline.benchmark DATASET: how fast it feeds an accelerator
                  (with bench_input, bench_report and strategy)

image_tfrecords.json is read by one loader, transforms.base.dataset_format.load_description
(`reader.load_info` here), with plain files, google-cloud-storage or tf.io.gfile.
Nothing here imports Apache Beam, nor the converter's launcher, graph, planning,
output preparation or local runner (tests/test_architecture.py).
"""
