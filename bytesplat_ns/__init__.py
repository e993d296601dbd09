"""ByteSplat: fast (distributed) 3D Gaussian Splatting training as a Nerfstudio method."""

from bytesplat_ns import nerfstudio_patches
from bytesplat_ns.checkpoints import allow_numpy_scalars_in_checkpoints

allow_numpy_scalars_in_checkpoints()
nerfstudio_patches.install()
