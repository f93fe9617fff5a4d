"""`from pipeline import reader` keeps working:
the tool lives in pipeline/readers/reader.py.

This name is the same module object as `pipeline.readers.reader`, so what is set on one is set on the other.
"""

import sys

if __name__ == "__main__":
    import runpy

    runpy.run_module("pipeline.readers.reader", run_name="__main__", alter_sys=True)
else:
    from pipeline.readers import reader

    sys.modules[__name__] = reader
