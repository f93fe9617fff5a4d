"""How every image is converted (`ImageSettings`): the one settings record each step of the conversion reads."""

from __future__ import annotations

from dataclasses import dataclass

from transforms.base.dataset_format import DEFAULT_MAX_IMAGE_MB, DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class ImageSettings:
    """How every image is converted. Defaults match the seed notebook."""

    width: int = 512
    height: int = 512
    resize_mode: str = "stretch"
    resample: str = "bilinear"
    image_format: str = "jpeg"
    jpeg_quality: int = 95
    chroma_subsampling: str = "4:2:0"
    image_backend: str = "auto"  # "auto": the fast core for the common case (see `decode.fast_kind`); "pillow": never
    reencode: bool = False  # True: an image already at the output size is re-encoded, not stored as it is
    background: tuple[int, int, int] = (255, 255, 255)
    max_pixels: int = DEFAULT_MAX_PIXELS  # Pillow's own bomb limit: ~537 MB of RGB pixels
    timeout_s: float = 60.0  # per image, enforced by `transforms.images.pool`; 0 = no limit
    throttled_retry_s: float = 600.0  # waits after 429/503 answers per read (`transforms.base.transient`), not timed
    reads_per_s_at_start: float | None = None  # this process's first read rate (`transient.process_start_rate`)
    max_file_mb: int = 256  # larger files are rejected by their listed size, and never read past it
    # Memory a conversion may need (`transforms.images.decode.working_bytes`), checked before decoding.
    max_image_mb: int = DEFAULT_MAX_IMAGE_MB
    # Memory all the conversions of one worker process may hold at once (see `transforms.base.memory`); 0 = no budget.
    # Dataflow runs one SDK process per vCPU and a standard machine has 3.75-4 GB per vCPU: 2 GB for
    # conversions leaves room for the process itself (~170 MB), the files being read and Beam's buffers.
    worker_memory_mb: int = 2048

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb * 1_000_000

    @property
    def max_image_bytes(self) -> int:
        return self.max_image_mb * 1_000_000

    @property
    def worker_memory_bytes(self) -> int:
        return self.worker_memory_mb * 1_000_000
