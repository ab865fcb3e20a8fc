"""Datasets for implicit-ham experiments: procedural legend_seg, bundled digits, and loaders for
CIFAR-10 and PASCAL VOC 2012 already on disk. Plain Python APIs; no download, no torchvision.
"""

from .cifar10 import CIFAR10Dataset
from .digits import DigitsDataset
from .errors import DataLayoutError
from .factory import DATASET_NAMES, TaskInfo, make_dataset, task_of
from .legend_dataset import LegendSegDataset, LegendSegSample, blob_mask
from .legend_seg import IGNORE_INDEX, LegendLayout, generate_legend_seg
from .textures import TEXTURE_BANK, Texture
from .voc import VOCSegmentation

__all__ = [
    "DATASET_NAMES",
    "IGNORE_INDEX",
    "TEXTURE_BANK",
    "CIFAR10Dataset",
    "DataLayoutError",
    "DigitsDataset",
    "LegendLayout",
    "LegendSegDataset",
    "LegendSegSample",
    "TaskInfo",
    "Texture",
    "VOCSegmentation",
    "blob_mask",
    "generate_legend_seg",
    "make_dataset",
    "task_of",
]
