"""The read-side tools: read, check, look at and time a converted dataset, with TensorFlow.

    reader        tf.data pipelines from dataset_info.json (`from pipeline import reader` still works)
    verify        python -m pipeline.verify DATASET: checks it end to end
    preview       python -m pipeline.preview DATASET: a contact sheet of sample images
    benchmark     python -m pipeline.benchmark DATASET: how fast it feeds an accelerator
                  (with bench_input, bench_report and strategy)

dataset_info.json is read in one place, `reader.load_info`, through Beam's file
systems. Nothing here imports the converter's launcher, graph, planning, output
preparation or local runner (tests/test_architecture.py).
"""
