"""
Infini-attention (model_infini.py) with a sharper feature map: an ablation outside the paper, `--model=infini_probes`.

`feature_scale` s (1, the paper, by default) makes the memory read and write with σ(s Q), σ(s K) in Eqs. 3-5. At
s = 1 and the paper model's init, σ(q)·σ(k_j) hardly varies with j, so a read starts as the average of everything
written (bench/README.md, recall); a larger s makes σ nearly 0 on negative coordinates, a sparser, sharper kernel.
At s = 1 this model computes what model_infini.py computes, bit for bit (lab/tests/test_lab_infini_probes.py).

The one seam: InfiniAttention.features (σ of the memory's queries and keys). Every layer's attention is the paper's
module with that method overridden; the weights, their names and their initialisation are the paper model's.
"""

import math
from dataclasses import dataclass

import model_infini
from model_infini import sigma


@dataclass
class Config(model_infini.Config):
    feature_scale: float = 1.0  # the memory's σ(s Q), σ(s K) (Eqs. 3-5); 1 = the paper

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.feature_scale) and self.feature_scale > 0.0):
            raise ValueError(f"feature_scale must be > 0, got {self.feature_scale}")


class ScaledFeatureAttention(model_infini.InfiniAttention):
    """The paper's Infini-attention whose memory reads and writes σ(s x), s = feature_scale."""
    feature_scale = 1.0

    def features(self, x):
        return sigma(x * self.feature_scale)


class Model(model_infini.Model):
    def __init__(self, config: Config):
        super().__init__(config)
        for layer in self.layers:       # the paper's attention, weights kept, with the scaled feature map
            layer.attn.__class__ = ScaledFeatureAttention
            layer.attn.feature_scale = config.feature_scale
