"""The GGUFArchitecture contract: the name is a GGUF architecture gguf knows, the fix-ups read a file
with no optional metadata and rearrange tensors without resizing them, and where the model plugin's
model is said to keep HF's names, the file's tensors map onto the same names through it as through
transformers' model."""

from __future__ import annotations

from typing import Any, ClassVar

from kvserve.interfaces.gguf_architecture import GGUFArchitecture
from kvserve.testing.contracts._base import ComponentContract, violation


class GGUFArchitectureContract(ComponentContract):
    """Every GGUF architecture plugin must pass this. Subclass it and name the architecture::

        class TestMyGGUF(GGUFArchitectureContract):
            gguf_architecture = "gpt2"          # the GGUF general.architecture
            hf_model_type = "gpt2"              # the transformers model type its files load as

    The fix-ups' effect on real weights is the plugin's own test (a file written as llama.cpp
    writes it must load as the HF checkpoint); this contract holds what the loader relies on.
    """

    kind = "gguf_architecture"
    interface = GGUFArchitecture
    hf_model_type: ClassVar[str | None] = None
    """The transformers model type of the config these files load as (default: the architecture name)."""

    def hf_config(self) -> Any:
        """A two-layer HF config of the architecture (its default sizes otherwise: it is built on the meta device)."""
        import transformers

        return transformers.AutoConfig.for_model(self.hf_model_type or self.component_name(), num_hidden_layers=2)

    def test_name_is_a_gguf_architecture(self, component):
        """The loader maps tensor names with gguf's own map of the architecture, so gguf must know it."""
        import gguf

        if self.component_name() not in gguf.MODEL_ARCH_NAMES.values():
            violation(
                f"GGUF architecture {self.component_name()!r} is not one the installed gguf knows "
                f"(gguf.MODEL_ARCH_NAMES); register it under the general.architecture its files carry"
            )

    def test_fix_config_reads_a_file_without_optional_metadata(self, component):
        config = self.hf_config()
        component().fix_config(lambda key: None, config)

    def test_fix_tensor_rearranges_without_resizing(self, component):
        """Every tensor of the HF model comes back a float32 tensor with as many elements (its shape may
        differ: the file's layout is not the checkpoint's)."""
        import torch
        import transformers

        config = self.hf_config()
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fixups = component()
        for hf_name, tensor in model.state_dict().items():
            fixed = fixups.fix_tensor(hf_name, tensor.clone(), config)
            if not isinstance(fixed, torch.Tensor) or fixed.numel() != tensor.numel() or fixed.dtype != tensor.dtype:
                got = f"{tuple(fixed.shape)} {fixed.dtype}" if isinstance(fixed, torch.Tensor) else repr(fixed)
                violation(f"fix_tensor({hf_name!r}) returned {got} for a {tuple(tensor.shape)} {tensor.dtype} tensor")

    def test_the_models_names_are_hfs_where_it_says_so(self, component):
        """With ``model_has_hf_names``, the loader maps a file's tensors onto the checkpoint names of the
        model plugin's model (no transformers modeling code to import): every GGUF tensor name must then
        come out under the HF name transformers' model gives it."""
        if not component.model_has_hf_names:
            return
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from kvserve.loader.gguf_source import hf_names_by_gguf_name

        config = self.hf_config()
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
        ours = hf_names_by_gguf_name(config, self.component_name(), component())
        hfs = hf_names_by_gguf_name(config, self.component_name(), GGUFArchitecture())
        if config.tie_word_embeddings:  # transformers lists the tied head's weight; no file stores it
            hfs = {gguf_name: hf_name for gguf_name, hf_name in hfs.items() if hf_name != "lm_head.weight"}
        if ours != hfs:
            wrong = sorted(
                f"{g}: {ours.get(g)} (transformers: {hfs.get(g)})" for g in {*ours, *hfs} if ours.get(g) != hfs.get(g)
            )
            violation(
                f"model_has_hf_names is set, but the model plugin's model names GGUF tensors otherwise than "
                f"transformers' model does: {wrong[:5]}"
            )
