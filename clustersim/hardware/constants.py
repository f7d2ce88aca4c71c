"""A chip family's fitted and published constants: efficiency, framework, collectives, serving."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clustersim.hardware import limits
from clustersim.hardware.spec import Bytes, NonNegativeDuration, Spec

__all__ = [
    "CollectiveConstants",
    "Efficiency",
    "Framework",
    "ServingConstants",
]


class Efficiency(Spec):
    """How much of peak a chip's operations reach: the compute model's hardware constants.

    Three are fitted per chip family (GPUs: scripts/calibrate_step.py; Trainium: with the
    collectives, scripts/calibrate_collectives.py --joint): `matmul`, `vector` and
    `pass_overhead`. The others are physical and not fitted: the tile a matrix multiply is
    padded to (the 128 x 128 systolic array of a NeuronCore; a tensor-core thread-block tile
    on a GPU), the contraction granularity, and the units output tiles are spread over (a
    GPU's SMs, whose last wave may run partly empty). See clustersim.training.step.
    """

    matmul: float = Field(
        ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of dense peak TFLOPS large matrix multiplications reach"
    )
    vector: float = Field(
        ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of peak HBM bandwidth memory-bound vector work reaches"
    )
    pass_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="pass_overhead",
        description="fixed time per forward or backward pass of a micro-batch through a "
        "pipeline stage (launching its compiled graph or kernels, synchronising its transfers)",
    )
    tile: int = Field(
        default=128, gt=0, le=65_536,
        description="the rows and columns of a matrix multiply are padded to this tile",
    )
    k_tile: int = Field(
        default=128, gt=0, le=65_536,
        description="the contraction dimension is padded to this step"
    )
    wave_units: int = Field(
        default=1, gt=0, le=65_536,
        description="units that output tiles are spread over in waves (SMs; 1: no waves)",
    )
    step_error_band: tuple[float, float] = Field(
        default=(0.0, 0.0),
        description="largest under- and over-prediction of step time over the family's "
        "published rows, calibration and unseen (fractions; scripts/validate_model.py)",
    )

    @model_validator(mode="after")
    def _check_band(self) -> Efficiency:
        low, high = self.step_error_band
        if not (-1 < low <= 0 <= high):
            raise ValueError("step_error_band: expected [low, high] with -1 < low <= 0 <= high")
        return self


class Framework(Spec):
    """What the usual training stack of a chip family does, where it changes the model.

    `attention`: flash (the s x s scores stay on chip) or unfused (scores, softmax and
    dropout go through HBM); a job's `attention` overrides it. `gradients`: the precision in
    which gradients are kept and reduced with 16-bit training. `tp_overlap`: whether the
    backward pass hides its tensor-parallel collectives behind the weight-gradient GEMMs.
    """

    attention: Literal["flash", "unfused"] = "flash"
    gradients: Literal["bf16", "fp32"] = "fp32"
    tp_overlap: bool = Field(
        default=False, description="the backward pass's tensor-parallel collectives run during "
        "the weight-gradient GEMMs (Megatron-LM from 2022)",
    )


class CollectiveConstants(Spec):
    """Calibrated constants of the collectives model (see clustersim.collectives.model).

    The physical hop latencies and link bandwidths come from the topology; these add what
    the hardware figures leave out: the fraction of link and HBM bandwidth a collective
    reaches, and the software/synchronisation time each algorithm step costs.
    """

    link_efficiency: float = Field(
        default=0.566, ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of chip-to-chip link bandwidth reached"
    )
    efa_efficiency: float = Field(
        default=0.674, ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of EFA (NIC and fabric) bandwidth reached"
    )
    hbm_efficiency: float = Field(
        default=0.335, ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of HBM bandwidth collective data movement reaches",
    )
    step_latency_s: NonNegativeDuration = Field(
        default=26.0e-6, alias="step_latency", le=limits.MAX_LATENCY_S,
        description="fixed time per algorithm step that crosses a chip-to-chip link",
    )
    chip_step_latency_s: NonNegativeDuration | None = Field(
        default=None, alias="chip_step_latency", le=limits.MAX_LATENCY_S,
        description="fixed time per algorithm step that stays on one chip (its ranks "
        "exchanging through HBM, no link crossed); step_latency when not given",
    )
    efa_step_latency_s: NonNegativeDuration = Field(
        default=718e-6, alias="efa_step_latency", le=limits.MAX_LATENCY_S,
        description="fixed time per algorithm step over EFA, beyond the fabric latency",
    )
    fabric_mesh_max_nodes: int = Field(
        default=16, gt=0, le=limits.MAX_INSTANCES,
        description="auto: mesh over EFA only up to this many nodes (Neuron: mesh suits small "
        "groups; its ingress congestion grows with peers)",
    )
    mesh_max_bytes: Bytes = Field(
        default=1e6, alias="mesh_max", description="auto: mesh below this size (Neuron: 1 MB)"
    )
    rdh_max_bytes: Bytes = Field(
        default=56e6, alias="rdh_max", description="auto: RDH below this size (Neuron: 56 MB)"
    )


class ServingConstants(Spec):
    """Calibrated constants of the serving iteration model (clustersim.serving.iteration),
    per chip family: what the hardware figures leave out of one inference iteration."""

    iteration_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="iteration_overhead", le=limits.MAX_LATENCY_S,
        description="fixed host time per iteration: launching the compiled graph, sampling, "
        "scheduling the next batch",
    )
    prefill_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="prefill_overhead", le=limits.MAX_LATENCY_S,
        description="fixed time added to an iteration that encodes prompt tokens (NxD "
        "Inference compiles context encoding as a graph of its own, apart from token "
        "generation); 0 where no data separates it",
    )
    prefill_layer_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="prefill_layer_overhead", le=limits.MAX_LATENCY_S,
        description="fixed time per layer of an iteration that encodes prompt tokens (each "
        "layer's context-encoding kernels start and synchronise once, whatever the prompt's "
        "length); 0 where no data separates it",
    )
    attention: Literal["flash", "unfused"] = Field(
        default="flash",
        description="the prefill (context-encoding) attention kernel: `flash`, one fused "
        "kernel whose scores never leave the chip; `unfused`, the scores written out by the "
        "first matmul and passed through mask and softmax as separate operations "
        "(transformers-neuronx's context encoding): free while they fit a rank's on-chip "
        "SRAM, priced at `score_efficiency` of HBM bandwidth when they do not",
    )
    score_efficiency: float = Field(
        default=0.369, ge=limits.MIN_EFFICIENCY, le=1,
        description="unfused attention: fraction of HBM bandwidth the passes over spilled "
        "attention scores reach (mask, softmax's reductions and elementwise steps)",
    )
    hbm_efficiency: float = Field(
        default=0.94, ge=limits.MIN_EFFICIENCY, le=1,
        description="fraction of peak HBM bandwidth inference kernels reach streaming weights "
        "and the KV cache (in place of the training fit's efficiency.vector); default: the "
        "Trn1 serving fit",
    )
    matmul_efficiency: float | None = Field(
        default=None, ge=limits.MIN_EFFICIENCY, le=1, alias="matmul",
        description="fraction of the dense peak (at the compute precision) inference "
        "matrix multiplies reach; default: the chip's efficiency.matmul (the training fit)",
    )
    overlap_collectives: bool = Field(
        default=False,
        description="the tensor-parallel all-reduces run under the layer's matrix work, "
        "pipelined over tiles of the tokens (NxD Inference compiles with "
        "--enable-ccop-compute-overlap): a layer takes max(compute, collectives) + "
        "min(compute, collectives) / tiles, tiles = tokens / chip tile rows (one tile in "
        "decode: no overlap)",
    )
    tp_link_efficiency: float | None = Field(
        default=None, ge=limits.MIN_EFFICIENCY, le=1,
        description="the replica's tensor-parallel all-reduce: fraction of the link "
        "bandwidth the inference stack's own all-reduce kernels reach (TensorRT-LLM's custom "
        "all-reduce on NVLink); default: the collectives' link_efficiency",
    )
    tp_step_latency_s: NonNegativeDuration | None = Field(
        default=None, alias="tp_step_latency", le=limits.MAX_LATENCY_S,
        description="the replica's tensor-parallel all-reduce: fixed time per algorithm step "
        "of the inference stack's own kernels; default: the collectives' step_latency",
    )
    tp_kernel_max_bytes: Bytes | None = Field(
        default=None, alias="tp_kernel_max",
        description="with tp_link_efficiency or tp_step_latency: the largest message the "
        "inference stack's own all-reduce kernels take at TP 2, half of it at a larger TP "
        "(TensorRT-LLM's custom all-reduce workspace: 16 MB at TP 2, 8 MB beyond); larger "
        "messages run the collectives' own algorithm, and no smaller message costs more "
        "than the workspace-sized one would there; default: the kernels at every size",
    )
    moe_layer_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="moe_layer_overhead", le=limits.MAX_LATENCY_S,
        description="fixed time per mixture-of-experts layer of an iteration (routing's "
        "top-k and the selected experts' gathers: work whose count does not grow with the "
        "tokens); 0 where no data separates it",
    )
    moe_decode_loads: Literal["distinct", "per-token"] = Field(
        default="distinct",
        description="the routed experts' weights an iteration reads: `distinct`, each expert "
        "its tokens reach once; `per-token`, each token's top-k by itself while tokens x "
        "top_k <= experts (NxD's forward_selective_loading, a loop over the tokens), every "
        "expert beyond (forward_all_experts): min(tokens x top_k, experts) loads a layer, "
        "each paying moe_expert_load_overhead",
    )
    moe_expert_load_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="moe_expert_load_overhead", le=limits.MAX_LATENCY_S,
        description="with moe_decode_loads per-token: fixed time per expert load of a MoE "
        "layer (its gather and matmul pair); 0 where no data separates it",
    )
    moe_prefill: Literal["routed", "every-expert", "blockwise"] = Field(
        default="routed",
        description="how a context-encoding iteration runs a mixture's experts: `routed`, "
        "each token through its top-k (the experts its tokens reach); `every-expert`, every "
        "routed expert over every token, the outputs masked by the router's choice "
        "(NxD's ExpertMLPs forward_all_experts): every expert's weights read and its FLOPs "
        "run over all the iteration's tokens, the partial outputs combined on chip; "
        "`blockwise`, NxD's ExpertMLPsV2 context-encoding dispatch (SDK 2.26): selective "
        "loading while tokens x top_k < experts, every expert while tokens x top_k < 512 "
        "(the block size), else forward_blockwise: ceil((T k - (E - 1)) / 512) + E - 1 "
        "blocks of 512 token slots, each one expert's matmuls over its gathered rows",
    )
    blockwise_element_s: NonNegativeDuration = Field(
        default=0.0, alias="blockwise_element", le=limits.MAX_LATENCY_S,
        description="with moe_prefill blockwise: time per element of a block's token rows "
        "(block size x hidden on a rank, each block of each MoE layer) beyond their HBM "
        "traffic: the block's gather of its tokens' hidden states and scatter-add of its "
        "output through the token-to-position index; 0 where no data "
        "separates it",
    )
    expert_invocation_overhead_s: NonNegativeDuration = Field(
        default=0.0, alias="expert_invocation_overhead", le=limits.MAX_LATENCY_S,
        description="with moe_prefill every-expert: fixed time per expert a context-encoding "
        "iteration's MoE layer runs (each expert's masked scale-and-add of the combine is "
        "its own short instruction stream); 0 where no data separates it",
    )
    all_reduce: Literal["mesh", "auto", "cheapest"] = Field(
        default="mesh",
        description="how a replica's tensor-parallel all-reduce runs inside an instance: "
        "`mesh`, the cheaper of mesh and single-step mesh at every size (what the published "
        "Trn1 serving TTFTs show: the size bands would make the short-prompt ones 35-88% "
        "slow and a long-prompt one 28% fast, KangaRing at 32 MiB that one 28% fast too); "
        "`auto`, the training runtime's choice by size bands; `cheapest`, the cheapest of "
        "mesh, single-step mesh, RDH and KangaRing at every size",
    )
