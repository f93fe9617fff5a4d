"""image-tfrecords: the launcher, options and Beam graph that turn image folders into TFRecords."""

__version__ = "0.1.0"
