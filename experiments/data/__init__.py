"""Datasets for implicit-ham experiments: procedural legend_seg, bundled digits, and loaders for
CIFAR-10 and PASCAL VOC 2012 already on disk. Plain Python APIs; no download, no torchvision.
"""

from experiments.data.cifar10 import CIFAR10Dataset
from experiments.data.digits import DigitsDataset
from experiments.data.errors import DataLayoutError
from experiments.data.factory import DATASET_NAMES, TaskInfo, make_dataset, task_of
from experiments.data.legend_dataset import LegendSegDataset, LegendSegSample, blob_mask
from experiments.data.legend_seg import IGNORE_INDEX, LegendLayout, generate_legend_seg
from experiments.data.textures import TEXTURE_BANK, Texture
from experiments.data.voc import VOCSegmentation

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
