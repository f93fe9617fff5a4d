"""Object detection and segmentation: annotations in (COCO, Pascal VOC, YOLO, CSV/JSONL boxes), records out."""
