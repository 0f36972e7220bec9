"""fp8proj as a vLLM plugin: ``vllm serve <bf16 checkpoint> --quantization fp8proj``.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes
(``vllm.plugins.load_general_plugins``). ``register()`` registers the
quantization config ``fp8proj`` with ``register_quantization_config``. The
config serves bf16 checkpoints (it reads no quantization file) and, since
``get_quant_method(layer, prefix)`` sees every layer's name, tags the MLA
projections by name:

- ``*.self_attn.q_b_proj`` and ``*.self_attn.o_proj`` (and the opt-in targets
  of ``FP8PROJ_ENGINE_TARGETS``): ``Fp8ProjLinearMethod``, an
  ``UnquantizedLinearMethod`` (same bf16 weight, same loader) whose
  ``process_weights_after_loading`` makes the private FP8 copy on sm_90 and
  whose ``apply`` calls the registered op ``torch.ops.fp8proj.linear`` (with
  ``--enforce-eager``: the fp8proj module over the same C++ layer). The op
  has a fake implementation, so vLLM's torch.compile traces it without a graph
  break, and its M-gate picks FP8 or bf16 per call inside the op, so one
  compiled graph and every captured CUDA graph serve all M.
- every other linear layer: ``UnquantizedLinearMethod``; every other layer
  (MoE experts, attention, embeddings): None, vLLM's unquantized default.

Off sm_90 the tagged layers keep vLLM's own bf16 code (no copy, no op).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from fp8proj.integrations import _engines
from fp8proj.integrations._engines import TagReport

logger = logging.getLogger("fp8proj.integrations.vllm")

QUANTIZATION_NAME = "fp8proj"

# Every get_quant_method decision of this process, in model-build order.
REPORT = TagReport()

_classes: dict[str, type] = {}


def register() -> None:
    """Entry point of group ``vllm.general_plugins``. Idempotent: vLLM may
    load plugins more than once per process."""
    from vllm.model_executor.layers import quantization as q

    config_cls = _build_classes()["config"]
    if q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(QUANTIZATION_NAME) is config_cls:
        return
    q.register_quantization_config(QUANTIZATION_NAME)(config_cls)
    logger.debug("[fp8proj] vllm: registered --quantization %s", QUANTIZATION_NAME)


def _build_classes() -> dict[str, type]:
    """The vLLM subclasses, defined on first use so that importing this module
    needs no vLLM."""
    if _classes:
        return _classes
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.base_config import (
        QuantizationConfig,
        QuantizeMethodBase,
    )

    class Fp8ProjLinearMethod(UnquantizedLinearMethod):
        """bf16 weight as vLLM keeps it, plus fp8proj's private FP8 copy and
        its M-gated op."""

        def __init__(self, prefix: str, policy: str) -> None:
            super().__init__()
            self.prefix = prefix
            self.policy = policy
            self.projection: _engines.EngineProjection | None = None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            # Off sm_90 the log line comes first (vLLM's CPU path may repack
            # and drop layer.weight), then exactly vLLM's unquantized method.
            ok, _ = _engines.arch_status()
            self.projection = None
            if not ok:
                _engines.prepare_layer(layer, self.prefix, self.policy, "vllm", logger)
            super().process_weights_after_loading(layer)
            if ok:
                self.projection = _engines.prepare_layer(
                    layer, self.prefix, self.policy, "vllm", logger)

        def apply(self, layer: torch.nn.Module, x: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
            if self.projection is None or bias is not None:
                return super().apply(layer, x, bias)
            return self.projection.run(x, layer.weight)

    class Fp8ProjConfig(QuantizationConfig):
        """``--quantization fp8proj``: bf16 checkpoint, FP8 copies of the MLA
        projections chosen by name."""

        def __init__(self, targets: tuple[str, ...] | None = None,
                     policy: str | None = None) -> None:
            super().__init__()
            self.targets = _engines.targets_from_env() if targets is None else targets
            self.policy = _engines.policy_from_env() if policy is None else policy
            logger.info("[fp8proj] vllm --quantization fp8proj: targets %s, policy %s",
                        ",".join(self.targets), self.policy)

        def get_name(self) -> str:
            return QUANTIZATION_NAME

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            return [torch.bfloat16]

        @classmethod
        def get_min_capability(cls) -> int:
            # bf16 serving needs Ampere; the FP8 path is checked per layer at
            # load (sm_90) and otherwise stays bf16 with one log line.
            return 80

        @staticmethod
        def get_config_filenames() -> list[str]:
            return []  # bf16 checkpoints: no quantization file to read

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> "Fp8ProjConfig":
            targets = config.get("targets")
            return cls(tuple(targets) if targets else None, config.get("policy"))

        def get_quant_method(self, layer: torch.nn.Module,
                             prefix: str) -> QuantizeMethodBase | None:
            if not isinstance(layer, LinearBase):
                return None
            target = _engines.target_of_prefix(prefix, self.targets)
            if target is None:
                return UnquantizedLinearMethod()
            if getattr(layer, "has_bias", False):
                REPORT.skipped.append((prefix, "layer has a bias"))
                return UnquantizedLinearMethod()
            REPORT.tagged.append(prefix)
            return Fp8ProjLinearMethod(prefix, self.policy)

    _classes.update(config=Fp8ProjConfig, method=Fp8ProjLinearMethod)
    return _classes


def tagged_layers(model: torch.nn.Module) -> list[str]:
    """Names of the layers of ``model`` served by ``Fp8ProjLinearMethod``."""
    method = _build_classes()["method"]
    return [n for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), method)]
