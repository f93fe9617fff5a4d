"""The read-side benchmark's parts: its input pipeline (bench_input), its report (bench_report), its device strategy;
and a detection record's parse, padding and object checks (detection), which the reader, verify, preview and the
benchmark share.

The read-side tools themselves are modules of `pipeline/`: reader (tf.data pipelines from image_tfrecords.json),
verify (python -m pipeline.verify DATASET), preview (python -m pipeline.preview DATASET) and benchmark
(python -m pipeline.benchmark DATASET, built on this package). image_tfrecords.json is read by one loader,
transforms.base.dataset_format.load_description (`reader.load_info`), with plain files, google-cloud-storage or
tf.io.gfile. Nothing on the read side imports Apache Beam, nor the converter's launcher, graph, planning, output
preparation or local runner (tests/test_architecture.py).
"""
