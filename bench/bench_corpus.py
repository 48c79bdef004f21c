"""Real model code split into stages: the corpus table.

Each model's source file, as its package ships it (installed from PyPI with
``--no-deps``, pinned), is copied into a project with a tiny ``example()``
appended, then, for each stage count:

* profiled and planned for ``--backend torch_stages`` (the model's own methods
  and the submodule holding the layer stack are followed) and, for comparison,
  for ``--backend torch`` as written (``pipe_split()`` in ``forward`` itself);
  a Flax model (Hugging Face's Flax GPT-2 and Llama) for ``--backend jax``, its
  submodules' ``__call__`` followed the same way;
* planned with the equal-layer rule (``uniform``) on the same costs;
* rewritten, run split (torch: over gloo, 1F1B, a few steps; JAX: GPipe on as
  many CPU devices) and verified against the unsplit model.

It prints, per model and stage count: the ops found (eager / as written), the
predicted step of syncpass's plan, of the equal-layer rule and of the
``pipe_split()`` form, the speedup over the rule, the measured step, and whether
the loss and every gradient matched.

    python bench/bench_corpus.py [--models vit,simple_vit,litgpt] [--steps 3]
    python bench/bench_corpus.py --variants   # other versions, configs, encoder-decoders
    python bench/bench_corpus.py --fourth-batch   # first tried after issue 26's changes

The tests (``tests/test_corpus.py``) run the same corpus. Figures are this
machine's CPU; with more stages than cores the measured steps mostly show the
cores being shared.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from syncpass.cli import main as syncpass

#: Pinned packages, installed with --no-deps beside the runtime dependencies their model
#: files import (so that pip never pulls another torch).
VIT_PACKAGES = ("vit-pytorch==1.26.14", "einops==0.8.2")
LITGPT_PACKAGES = (
    "litgpt==0.5.13",
    "lightning==2.6.6",
    "lightning-utilities==0.15.3",
    "torchmetrics==1.9.0",
    "fsspec==2026.9.0",
    "jsonargparse==4.53.0",
    "huggingface-hub==2.4.0",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "tqdm==4.70.1",
)

#: Hugging Face transformers with what its model files import (numpy, packaging, filelock and
#: typing-extensions come with torch and jax).
HF_PACKAGES = (
    "transformers==5.25.0",
    "huggingface-hub==2.4.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "regex==2026.11.19",
    "pyyaml==6.0.4",
    "tqdm==4.70.1",
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "h11==0.16.0",
    "truststore==0.10.5",
    "idna==3.13",
    "certifi==2026.5.20",
)

#: Hugging Face's Flax models: the 4.x releases ship them (5.0 removed them), with the
#: huggingface-hub, tokenizers and requests those import.
FLAX_HF_PACKAGES = (
    "transformers==4.57.3",
    "huggingface-hub==0.36.2",
    "tokenizers==0.22.2",
    "safetensors==0.8.0",
    "regex==2026.11.19",
    "pyyaml==6.0.4",
    "tqdm==4.70.1",
    "fsspec==2026.9.0",
    "requests==2.34.2",
    "urllib3==2.8.0",
    "charset-normalizer==3.5.3",
    "idna==3.13",
    "certifi==2026.5.20",
)

#: torchvision with what its package imports (numpy comes with torch and jax).
TORCHVISION_PACKAGES = ("torchvision==0.28.0", "pillow==13.0.0")

#: timm imports torchvision (its frozen BatchNorm, its transforms).
TIMM_PACKAGES = ("timm==1.0.31", *TORCHVISION_PACKAGES)

#: torchtune with what ``import torchtune`` imports (its datasets, tokenizers and torchao), and
#: huggingface-hub with what that imports.
TORCHTUNE_PACKAGES = (
    "torchtune==0.6.1",
    "torchao==0.10.0",
    "datasets==5.2.0",
    "pyarrow==26.0.1",
    "pandas==3.1.1",
    "tzdata==2026.6",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "xxhash==4.1.0",
    "omegaconf==2.4.0",
    "antlr4-python3-runtime==4.13.2",
    "tiktoken==0.14.0",
    "sentencepiece==0.2.3",
    "pillow==13.0.0",
    *HF_PACKAGES[1:],
)

#: torchtitan with what its model package imports: its config system (tyro), spmd-types, and
#: triton, which its MoE token dispatcher imports at module level (imported, never run here).
TORCHTITAN_PACKAGES = (
    "torchtitan==0.3.0",
    "spmd-types==0.2.3",
    "tyro==1.0.16",
    "docstring-parser==0.18.0",
    "typeguard==4.6.0",
    "triton==3.9.0",
)

#: PyPI's torchvision wheel links CUDA libraries that the pinned CPU torch does not ship, so its
#: compiled operators (detection: nms, roi_align, ...) do not load; torchvision's Python runs
#: without them, except that at import it registers fake kernels for two of them, which must
#: exist. The copy declares those two schemas first, once per process (no kernel: calling them
#: fails). ResNet and ViT call none of torchvision's compiled operators.
TORCHVISION_PREAMBLE = """import torch

# torchvision's compiled operators are not loaded (see bench/bench_corpus.py).
try:
    torch.ops.torchvision.qnms.default
except (AttributeError, RuntimeError):
    _torchvision = torch.library.Library("torchvision", "FRAGMENT")
    _torchvision.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
"""

VIT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = {cls}(image_size=32, patch_size=8, num_classes=10, dim=64, depth=6, heads=4, mlp_dim=128)
    return model, (torch.randn(8, 3, 32, 32),), torch.randint(0, 10, (8,)), nn.functional.cross_entropy
"""

LITGPT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = Config.from_name(
        "pythia-14m", n_layer=6, n_head=4, n_embd=32, block_size=16, vocab_size=64,
        padded_vocab_size=64,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""


#: Dropout off: the split run and the unsplit reference would draw different masks.
GPT2_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=6, n_head=4, n_embd=32, n_positions=32, vocab_size=64, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(output, targets):
        logits = output.logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT2LMHeadModel(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""

LLAMA_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(output, targets):
        logits = output.logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return LlamaForCausalLM(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""


#: BertModel returns a dataclass whose ``last_hidden_state`` is a plain lookup into the
#: encoder's output after the last block, and whose ``pooler_output`` is computed from it:
#: the loss reads both. Dropout off, as for GPT-2.
BERT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    tokens = torch.randint(0, 64, (8, 16))

    def loss(output, labels):
        pooled = nn.functional.cross_entropy(output.pooler_output, labels)
        return pooled + output.last_hidden_state.pow(2).mean()

    return BertModel(config), (tokens,), torch.randint(0, 32, (8,)), loss
"""


#: Batch 16 at 64x64: with one image per micro-batch, BatchNorm after the last stage's 1x1
#: feature maps would see one value per channel.
RESNET_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
    images, labels = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    return model, (images,), labels, nn.functional.cross_entropy
"""

TIMM_VIT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=6, num_heads=4
    )
    return model, (torch.randn(8, 3, 32, 32),), torch.randint(0, 10, (8,)), nn.functional.cross_entropy
"""


#: The Flax example convention (docs/jax.md): the module, its variables, the inputs its
#: ``__call__`` takes positionally, the target and the loss. Dropout is off by default
#: (``deterministic=True``).
FLAX_LM_EXAMPLE = """

def example():
    config = {config}
    model = {cls}(config)
    tokens = jax.random.randint(jax.random.key(0), (8, 17), 0, 64)
    inputs = tokens[:, :-1]
    mask = jnp.ones_like(inputs)
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    variables = model.init(jax.random.key(1), inputs, mask, positions)

    def loss(output, targets):
        log_probs = jax.nn.log_softmax(output.logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))

    return model, variables, (inputs, mask, positions), tokens[:, 1:], loss
"""

FLAX_GPT2_CONFIG = (
    "GPT2Config(n_layer=6, n_head=4, n_embd=32, n_positions=32, vocab_size=64, "
    "bos_token_id=0, eos_token_id=0)"
)
FLAX_LLAMA_CONFIG = (
    "LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, "
    "num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)"
)


@dataclass(frozen=True)
class CorpusModel:
    """A model file of an installed package, and the example appended to its copy.

    ``package`` is the file's own package when it imports relatively (Hugging Face's
    ``from ...modeling_utils import``): the copy imports the same modules absolutely.
    ``until`` ends the copy before the file's first line that starts with it (torchvision's
    registered builders, which refuse to be registered a second time), and ``preamble`` goes
    before it. ``backend`` is the form it is split into (``torch_stages``, or ``jax``);
    ``model`` names the model class when the file has several (``--model``).
    """

    name: str
    packages: tuple[str, ...]
    source: str  # inside the install folder
    example: str
    stages: tuple[int, ...]
    layers: str | tuple[str, ...]  # the op id prefix of its layer stack (of each, for two)
    depth: int  # how many layers the example builds
    kinds: int = 1  # how many different layers (by FLOPs) the stack holds
    package: str = ""
    until: str = ""
    preamble: str = ""
    backend: str = "torch_stages"
    model: str = ""
    unused: int = 0  # parameters its forward never reads with the example: no stage holds them

    @property
    def isolated(self) -> bool:
        """Whether its commands run in a fresh process: a transformers 4.x (the Flax models',
        the 4.x variants') would meet the 5.x that an earlier torch model imported into
        this one."""
        return self.backend == "jax" or self.packages[0].startswith("transformers==4.")

    @property
    def environment(self) -> dict[str, str]:
        """What its commands' fresh processes add to the environment: a JAX model's tell
        transformers not to import torch (``USE_TORCH=0``), as an install without torch runs
        them (torch is here for the other models; importing it costs 4-5 s a process)."""
        return {"USE_TORCH": "0"} if self.backend == "jax" else {}

    def model_arguments(self) -> list[str]:
        """The backend and ``--model`` arguments of every command run on this model."""
        return ["--backend", self.backend, *(["--model", self.model] if self.model else [])]


MODELS = (
    CorpusModel(
        "vit",
        VIT_PACKAGES,
        "vit_pytorch/vit.py",
        VIT_EXAMPLE.format(cls="ViT"),
        (2, 4, 8),
        "transformer.layers.",
        6,
    ),
    CorpusModel(
        "simple_vit",
        VIT_PACKAGES,
        "vit_pytorch/simple_vit.py",
        VIT_EXAMPLE.format(cls="SimpleViT"),
        (2, 4),
        "transformer.layers.",
        6,
    ),
    CorpusModel(
        "litgpt", LITGPT_PACKAGES, "litgpt/model.py", LITGPT_EXAMPLE, (2, 4), "transformer.h.", 6
    ),
    CorpusModel(
        "hf_gpt2",
        HF_PACKAGES,
        "transformers/models/gpt2/modeling_gpt2.py",
        GPT2_EXAMPLE,
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.gpt2",
    ),
    CorpusModel(
        "hf_llama",
        HF_PACKAGES,
        "transformers/models/llama/modeling_llama.py",
        LLAMA_EXAMPLE,
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.llama",
    ),
    CorpusModel(
        "hf_bert",
        HF_PACKAGES,
        "transformers/models/bert/modeling_bert.py",
        BERT_EXAMPLE,
        (2, 4),
        "encoder.layer.",
        6,
        package="transformers.models.bert",
        model="BertModel",
    ),
    CorpusModel(
        "tv_resnet",
        TORCHVISION_PACKAGES,
        "torchvision/models/resnet.py",
        RESNET_EXAMPLE,
        (2, 4, 8),
        "layer",
        8,
        2,  # a stage's first block downsamples (after layer1)
        package="torchvision.models",
        until="def _resnet(",
        preamble=TORCHVISION_PREAMBLE,
    ),
    CorpusModel(
        "timm_vit",
        TIMM_PACKAGES,
        "timm/models/vision_transformer.py",
        TIMM_VIT_EXAMPLE,
        (2, 4, 8),
        "blocks.",
        6,
        package="timm.models",
        until="def _create_vision_transformer(",
        preamble=TORCHVISION_PREAMBLE,
    ),
    CorpusModel(
        "flax_gpt2",
        FLAX_HF_PACKAGES,
        "transformers/models/gpt2/modeling_flax_gpt2.py",
        FLAX_LM_EXAMPLE.format(config=FLAX_GPT2_CONFIG, cls="FlaxGPT2LMHeadModule"),
        (2, 4),
        "transformer.h.blocks.",
        6,
        package="transformers.models.gpt2",
        backend="jax",
        model="FlaxGPT2LMHeadModule",
    ),
    CorpusModel(
        "flax_llama",
        FLAX_HF_PACKAGES,
        "transformers/models/llama/modeling_flax_llama.py",
        FLAX_LM_EXAMPLE.format(config=FLAX_LLAMA_CONFIG, cls="FlaxLlamaForCausalLMModule"),
        (2, 4),
        "model.layers.blocks.",
        6,
        package="transformers.models.llama",
        backend="jax",
        model="FlaxLlamaForCausalLMModule",
    ),
)


#: A Hugging Face causal LM of ``cls`` from a tiny ``config`` (dropout off).
HF_LM_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = {config}
    tokens = torch.randint(0, 64, (8, 17))

    def loss(output, targets):
        logits = output.logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return {cls}(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""

HF_VIT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=6,
        num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=10,
    )
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def loss(output, targets):
        return nn.functional.cross_entropy(output.logits, targets)

    return ViTForImageClassification(config), (images,), labels, loss
"""

#: litgpt's Llama 3.2 config, shrunk: rotary embeddings and grouped-query attention.
LITGPT_LLAMA_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = Config.from_name(
        "Llama-3.2-1B", n_layer=6, n_head=4, n_query_groups=2, n_embd=32, intermediate_size=64,
        block_size=32, vocab_size=64, padded_vocab_size=64,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""

#: An image classifier ``{build}`` on 8 images of {size}x{size}.
VISION_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = {build}
    images, labels = torch.randn(8, 3, {size}, {size}), torch.randint(0, 10, (8,))
    return model, (images,), labels, nn.functional.cross_entropy
"""

_HF_LM = "vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, "
_HF_HEADS = "num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, "

#: An image classifier ``{build}`` on 16 images of {size}x{size} (BatchNorm: with 8 micro-batches
#: of one image, the last stages' small feature maps would see too few values per channel).
VISION16_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = {build}
    images, labels = torch.randn(16, 3, {size}, {size}), torch.randint(0, 10, (16,))
    return model, (images,), labels, nn.functional.cross_entropy
"""

#: A Hugging Face sequence classifier on 8 sequences of 16 tokens.
HF_CLS_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = {config}
    tokens, labels = torch.randint(0, 64, (8, 16)), torch.randint(0, 10, (8,))

    def loss(output, targets):
        return nn.functional.cross_entropy(output.logits, targets)

    return {cls}(config), (tokens,), labels, loss
"""

#: T5's encoder alone: its relative position bias is computed by the first layer only and
#: handed on to the others.
T5_ENCODER_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=6, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        feed_forward_proj="gated-gelu", use_cache=False, is_encoder_decoder=False,
    )
    tokens = torch.randint(0, 64, (8, 16))

    def loss(output, targets):
        return nn.functional.mse_loss(output.last_hidden_state, targets)

    return T5EncoderModel(config), (tokens,), torch.randn(8, 16, 32), loss
"""

#: litgpt's Mixtral config, shrunk: a mixture of 4 experts, 2 per token (LLaMAMoE).
LITGPT_MIXTRAL_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = Config.from_name(
        "Mixtral-8x7B-v0.1", n_layer=6, n_head=4, n_query_groups=2, n_embd=32,
        intermediate_size=64, n_expert=4, n_expert_per_token=2, block_size=32, vocab_size=64,
        padded_vocab_size=64,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT(config), (tokens[:, :-1],), tokens[:, 1:], loss
"""

#: timm's Mixer starts its head at zero, which would leave every other gradient zero: verify
#: would compare zeros. The example draws the head's weights.
MIXER_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = MlpMixer(
        num_classes=10, img_size=32, patch_size=8, num_blocks=6, embed_dim=64, drop_rate=0.0,
        drop_path_rate=0.0,
    )
    nn.init.normal_(model.head.weight, std=0.02)
    return model, (torch.randn(8, 3, 32, 32),), torch.randint(0, 10, (8,)), nn.functional.cross_entropy
"""

#: Whisper's encoder alone: two convolutions over 16 mel bins of 32 frames, then the layers.
WHISPER_ENCODER_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = WhisperConfig(
        num_mel_bins=16, d_model=32, encoder_layers=6, encoder_attention_heads=4,
        encoder_ffn_dim=64, max_source_positions=16, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, encoder_layerdrop=0.0,
    )
    features = torch.randn(8, 16, 32)

    def loss(output, targets):
        return nn.functional.mse_loss(output.last_hidden_state, targets)

    return WhisperEncoder(config), (features,), torch.randn(8, 16, 32), loss
"""

#: Models of the same kinds as MODELS, first tried as a new user would, with no test of
#: syncpass written against them (``--held-out``), in two batches; what they found wrong
#: is fixed (or, where not, said in docs/stages.md) and they stay here, so it stays fixed
#: (``tests/test_corpus.py`` runs those that found a bug at 4 stages: TESTED_HELD_OUT).
HELD_OUT = (
    CorpusModel(
        "hf_qwen2",  # its masks by layer type, in a dict
        HF_PACKAGES,
        "transformers/models/qwen2/modeling_qwen2.py",
        HF_LM_EXAMPLE.format(
            config=f"Qwen2Config({_HF_LM}{_HF_HEADS}use_cache=False, tie_word_embeddings=True)",
            cls="Qwen2ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.qwen2",
        model="Qwen2ForCausalLM",
    ),
    CorpusModel(
        "hf_mistral",
        HF_PACKAGES,
        "transformers/models/mistral/modeling_mistral.py",
        HF_LM_EXAMPLE.format(
            config=f"MistralConfig({_HF_LM}{_HF_HEADS}use_cache=False, sliding_window=8)",
            cls="MistralForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.mistral",
        model="MistralForCausalLM",
    ),
    CorpusModel(
        "hf_neox",
        HF_PACKAGES,
        "transformers/models/gpt_neox/modeling_gpt_neox.py",
        HF_LM_EXAMPLE.format(
            config="GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, "
            "num_hidden_layers=6, num_attention_heads=4, max_position_embeddings=32, "
            "use_cache=False, hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, "
            "eos_token_id=0)",
            cls="GPTNeoXForCausalLM",
        ),
        (2, 4),
        "gpt_neox.layers.",
        6,
        package="transformers.models.gpt_neox",
        model="GPTNeoXForCausalLM",
    ),
    CorpusModel(
        "hf_opt",  # LayerDrop's continue in the layer loop, two submodules down
        HF_PACKAGES,
        "transformers/models/opt/modeling_opt.py",
        HF_LM_EXAMPLE.format(
            config="OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=6, "
            "num_attention_heads=4, max_position_embeddings=32, word_embed_proj_dim=32, "
            "dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, "
            "use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=0)",
            cls="OPTForCausalLM",
        ),
        (2, 4),
        "model.decoder.layers.",
        6,
        package="transformers.models.opt",
        model="OPTForCausalLM",
    ),
    CorpusModel(
        "hf_vit",  # self.vit(pixel_values, ..., **kwargs) leaves bool_masked_pos to kwargs
        HF_PACKAGES,
        "transformers/models/vit/modeling_vit.py",
        HF_VIT_EXAMPLE,
        (2, 4),
        "vit.layers.",
        6,
        package="transformers.models.vit",
        model="ViTForImageClassification",
    ),
    CorpusModel(
        "litgpt_llama",
        LITGPT_PACKAGES,
        "litgpt/model.py",
        LITGPT_LLAMA_EXAMPLE,
        (2, 4),
        "transformer.h.",
        6,
        model="GPT",
    ),
    CorpusModel(
        "timm_convnext",  # the file has a ConvNeXtStage of its own
        TIMM_PACKAGES,
        "timm/models/convnext.py",
        VISION_EXAMPLE.format(
            build="ConvNeXt(depths=(2, 2, 4, 2), dims=(16, 32, 64, 128), num_classes=10)",
            size=64,
        ),
        (2, 4),
        "stages.",
        4,
        package="timm.models",
        until="def _create_convnext(",
        preamble=TORCHVISION_PREAMBLE,
        model="ConvNeXt",
    ),
    CorpusModel(
        # self.class_token.expand(...): a parameter's method; the encoder runs its layers
        # inside one expression (return self.ln(self.layers(self.dropout(input))))
        "tv_vit",
        TORCHVISION_PACKAGES,
        "torchvision/models/vision_transformer.py",
        VISION_EXAMPLE.format(
            build="VisionTransformer(image_size=32, patch_size=8, num_layers=6, num_heads=4, "
            "hidden_dim=64, mlp_dim=128, num_classes=10)",
            size=32,
        ),
        (2, 4),
        "encoder.layers.",
        6,
        package="torchvision.models",
        until="def _vision_transformer(",
        preamble=TORCHVISION_PREAMBLE,
        model="VisionTransformer",
    ),
    CorpusModel(
        "tv_convnext",
        TORCHVISION_PACKAGES,
        "torchvision/models/convnext.py",
        VISION_EXAMPLE.format(
            build="ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, 64, 2), "
            "CNBlockConfig(64, 128, 4), CNBlockConfig(128, None, 2)], num_classes=10)",
            size=64,
        ),
        (2, 4),
        "features.",
        8,
        package="torchvision.models",
        until="def _convnext(",
        preamble=TORCHVISION_PREAMBLE,
        model="ConvNeXt",
    ),
    CorpusModel(
        "tv_swin",  # stochastic depth off: verify compares with the unsplit model
        TORCHVISION_PACKAGES,
        "torchvision/models/swin_transformer.py",
        VISION_EXAMPLE.format(
            build="SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], "
            "num_heads=[1, 2, 4, 8], window_size=[4, 4], num_classes=10, "
            "stochastic_depth_prob=0.0)",
            size=64,
        ),
        (2, 4),
        "features.",
        8,
        package="torchvision.models",
        until="def _swin_transformer(",
        preamble=TORCHVISION_PREAMBLE,
        model="SwinTransformer",
    ),
    # A second batch, tried the same way.
    CorpusModel(
        "hf_gemma2",  # alternating sliding/full attention, logit soft-capping, scaled embeddings
        HF_PACKAGES,
        "transformers/models/gemma2/modeling_gemma2.py",
        HF_LM_EXAMPLE.format(
            config=f"Gemma2Config({_HF_LM}{_HF_HEADS}head_dim=8, sliding_window=8, "
            "query_pre_attn_scalar=8, attention_dropout=0.0, use_cache=False, pad_token_id=0, "
            "bos_token_id=0, eos_token_id=0)",
            cls="Gemma2ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.gemma2",
        model="Gemma2ForCausalLM",
    ),
    CorpusModel(
        "hf_phi3",  # fused qkv and gate_up projections, partial rotary
        HF_PACKAGES,
        "transformers/models/phi3/modeling_phi3.py",
        HF_LM_EXAMPLE.format(
            config=f"Phi3Config({_HF_LM}{_HF_HEADS}resid_pdrop=0.0, embd_pdrop=0.0, "
            "attention_dropout=0.0, use_cache=False, pad_token_id=0, bos_token_id=0, "
            "eos_token_id=0)",
            cls="Phi3ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.phi3",
        model="Phi3ForCausalLM",
    ),
    CorpusModel(
        "hf_bloom",  # ALiBi built in forward from the mask, handed to every block
        HF_PACKAGES,
        "transformers/models/bloom/modeling_bloom.py",
        HF_LM_EXAMPLE.format(
            config="BloomConfig(vocab_size=64, hidden_size=32, n_layer=6, n_head=4, "
            "hidden_dropout=0.0, attention_dropout=0.0, use_cache=False, bos_token_id=0, "
            "eos_token_id=0, pad_token_id=0)",
            cls="BloomForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.bloom",
        model="BloomForCausalLM",
    ),
    CorpusModel(
        "hf_falcon",  # parallel attention/MLP, rotary
        HF_PACKAGES,
        "transformers/models/falcon/modeling_falcon.py",
        HF_LM_EXAMPLE.format(
            config="FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6, "
            "num_attention_heads=4, max_position_embeddings=32, hidden_dropout=0.0, "
            "attention_dropout=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)",
            cls="FalconForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.falcon",
        model="FalconForCausalLM",
    ),
    CorpusModel(
        "hf_distilbert",  # layers two submodules down (distilbert.transformer.layer)
        HF_PACKAGES,
        "transformers/models/distilbert/modeling_distilbert.py",
        HF_CLS_EXAMPLE.format(
            config="DistilBertConfig(vocab_size=64, dim=32, n_layers=6, n_heads=4, hidden_dim=64, "
            "max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, "
            "seq_classif_dropout=0.0, num_labels=10, pad_token_id=0)",
            cls="DistilBertForSequenceClassification",
        ),
        (2, 4),
        "distilbert.transformer.layer.",
        6,
        package="transformers.models.distilbert",
        model="DistilBertForSequenceClassification",
    ),
    CorpusModel(
        "hf_t5_encoder",  # relative position bias made by layer 0 and handed on
        HF_PACKAGES,
        "transformers/models/t5/modeling_t5.py",
        T5_ENCODER_EXAMPLE,
        (2, 4),
        "encoder.block.",
        6,
        package="transformers.models.t5",
        model="T5EncoderModel",
    ),
    CorpusModel(
        "litgpt_mixtral",  # mixture of experts: data-dependent routing in every block
        LITGPT_PACKAGES,
        "litgpt/model.py",
        LITGPT_MIXTRAL_EXAMPLE,
        (2, 4),
        "transformer.h.",
        6,
        model="GPT",
    ),
    CorpusModel(
        "timm_swin",  # window attention, patch merging between stages (timm's own Swin)
        TIMM_PACKAGES,
        "timm/models/swin_transformer.py",
        VISION_EXAMPLE.format(
            build="SwinTransformer(img_size=64, patch_size=4, embed_dim=16, depths=(2, 2, 2, 2), "
            "num_heads=(1, 2, 4, 8), window_size=4, num_classes=10, drop_rate=0.0, "
            "drop_path_rate=0.0)",
            size=64,
        ),
        (2, 4),
        "layers.",
        4,
        package="timm.models",
        until="def _create_swin_transformer(",
        preamble=TORCHVISION_PREAMBLE,
        model="SwinTransformer",
    ),
    CorpusModel(
        "timm_efficientnet",  # blocks: a Sequential of Sequentials, BatchNorm
        TIMM_PACKAGES,
        "timm/models/efficientnet.py",
        VISION16_EXAMPLE.format(
            build="EfficientNet(decode_arch_def([['ds_r1_k3_s1_e1_c16'], ['ir_r2_k3_s2_e6_c24'], "
            "['ir_r2_k5_s2_e6_c40_se0.25'], ['ir_r2_k3_s2_e6_c80_se0.25']]), num_classes=10, "
            "stem_size=16, num_features=128, drop_rate=0.0, drop_path_rate=0.0)",
            size=64,
        ),
        (2, 4),
        "blocks.",
        4,
        package="timm.models",
        until="def _create_effnet(",
        preamble=TORCHVISION_PREAMBLE,
        model="EfficientNet",
    ),
    CorpusModel(
        "timm_mixer",
        TIMM_PACKAGES,
        "timm/models/mlp_mixer.py",
        MIXER_EXAMPLE,
        (2, 4),
        "stem",
        6,
        package="timm.models",
        until="def _create_mixer(",
        preamble=TORCHVISION_PREAMBLE,
        model="MlpMixer",
    ),
    CorpusModel(
        "tv_mobilenetv3",  # Sequential features with squeeze-excite, BatchNorm
        TORCHVISION_PACKAGES,
        "torchvision/models/mobilenetv3.py",
        VISION16_EXAMPLE.format(
            build="MobileNetV3(*_mobilenet_v3_conf('mobilenet_v3_small', width_mult=0.5), "
            "num_classes=10, dropout=0.0)",
            size=64,
        ),
        (2, 4),
        "features.",
        13,
        package="torchvision.models",
        until="def _mobilenet_v3(",
        preamble=TORCHVISION_PREAMBLE,
        model="MobileNetV3",
    ),
    CorpusModel(
        "tv_regnet",  # trunk_output: a Sequential of AnyStage Sequentials
        TORCHVISION_PACKAGES,
        "torchvision/models/regnet.py",
        VISION16_EXAMPLE.format(
            build="RegNet(BlockParams.from_init_params(depth=8, w_0=16, w_a=8.0, w_m=2.0, "
            "group_width=8), num_classes=10)",
            size=64,
        ),
        (2, 4),
        "trunk_output.",
        3,  # three widths at this config: three AnyStage children
        package="torchvision.models",
        until="def _regnet(",
        preamble=TORCHVISION_PREAMBLE,
        model="RegNet",
    ),
    CorpusModel(
        "hf_gemma3",  # Gemma 3 text: local and global rotary tables, 5 sliding : 1 full layers
        HF_PACKAGES,
        "transformers/models/gemma3/modeling_gemma3.py",
        HF_LM_EXAMPLE.format(
            config=f"Gemma3TextConfig({_HF_LM}{_HF_HEADS}head_dim=8, sliding_window=8, "
            "query_pre_attn_scalar=8, attention_dropout=0.0, use_cache=False, pad_token_id=0, "
            "bos_token_id=0, eos_token_id=0)",
            cls="Gemma3ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.gemma3",
        model="Gemma3ForCausalLM",
    ),
    CorpusModel(
        "hf_gptj",  # parallel attention/MLP, interleaved partial rotary
        HF_PACKAGES,
        "transformers/models/gptj/modeling_gptj.py",
        HF_LM_EXAMPLE.format(
            config="GPTJConfig(vocab_size=64, n_positions=32, n_embd=32, n_layer=6, n_head=4, "
            "rotary_dim=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, "
            "bos_token_id=0, eos_token_id=0)",
            cls="GPTJForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.gptj",
        model="GPTJForCausalLM",
    ),
    CorpusModel(
        "hf_whisper_encoder",  # convolutions, then the layers; no LM head
        HF_PACKAGES,
        "transformers/models/whisper/modeling_whisper.py",
        WHISPER_ENCODER_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        package="transformers.models.whisper",
        model="WhisperEncoder",
    ),
    CorpusModel(
        "timm_deit",  # VisionTransformerDistilled: forward inherited from vision_transformer.py
        TIMM_PACKAGES,
        "timm/models/deit.py",
        VISION_EXAMPLE.format(
            build="VisionTransformerDistilled(img_size=32, patch_size=8, num_classes=10, "
            "embed_dim=64, depth=6, num_heads=4)",
            size=32,
        ),
        (2, 4),
        "blocks.",
        6,
        package="timm.models",
        until="def _create_deit(",
        preamble=TORCHVISION_PREAMBLE,
        model="VisionTransformerDistilled",
    ),
    CorpusModel(
        "tv_efficientnet",  # MBConv blocks with stochastic depth (off) and squeeze-excite
        TORCHVISION_PACKAGES,
        "torchvision/models/efficientnet.py",
        VISION16_EXAMPLE.format(
            build="EfficientNet([MBConvConfig(1, 3, 1, 16, 16, 1), MBConvConfig(6, 3, 2, 16, 24, 2), "
            "MBConvConfig(6, 5, 2, 24, 40, 2), MBConvConfig(6, 3, 2, 40, 80, 2)], dropout=0.0, "
            "stochastic_depth_prob=0.0, num_classes=10)",
            size=64,
        ),
        (2, 4),
        "features.",
        6,
        package="torchvision.models",
        until="def _efficientnet(",
        preamble=TORCHVISION_PREAMBLE,
        model="EfficientNet",
    ),
    # A third batch, tried the same way: every one split and verified at its first try.
    CorpusModel(
        "hf_gpt_neo",  # alternating global and local attention
        HF_PACKAGES,
        "transformers/models/gpt_neo/modeling_gpt_neo.py",
        HF_LM_EXAMPLE.format(
            config=(
                "GPTNeoConfig(vocab_size=64, hidden_size=32, num_layers=6, num_heads=4, "
                "attention_types=[[['global', 'local'], 3]], window_size=8, "
                "max_position_embeddings=32, embed_dropout=0.0, attention_dropout=0.0, "
                "resid_dropout=0.0, use_cache=False)"
            ),
            cls="GPTNeoForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.gpt_neo",
        model="GPTNeoForCausalLM",
    ),
    CorpusModel(
        "hf_mpt",  # ALiBi, return_dict from the config
        HF_PACKAGES,
        "transformers/models/mpt/modeling_mpt.py",
        HF_LM_EXAMPLE.format(
            config=(
                "MptConfig(vocab_size=64, d_model=32, n_layers=6, n_heads=4, "
                "max_seq_len=32, use_cache=False)"
            ),
            cls="MptForCausalLM",
        ),
        (2, 4),
        "transformer.blocks.",
        6,
        package="transformers.models.mpt",
        model="MptForCausalLM",
    ),
    CorpusModel(
        "hf_codegen",  # rotary on part of each head, parallel attention and MLP
        HF_PACKAGES,
        "transformers/models/codegen/modeling_codegen.py",
        HF_LM_EXAMPLE.format(
            config=(
                "CodeGenConfig(vocab_size=64, n_embd=32, n_layer=6, n_head=4, "
                "rotary_dim=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, "
                "attn_pdrop=0.0, use_cache=False)"
            ),
            cls="CodeGenForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.codegen",
        model="CodeGenForCausalLM",
    ),
    CorpusModel(
        "hf_biogpt",  # LayerDrop and scaled embeddings
        HF_PACKAGES,
        "transformers/models/biogpt/modeling_biogpt.py",
        HF_LM_EXAMPLE.format(
            config=(
                "BioGptConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6, "
                "num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0, "
                "attention_probs_dropout_prob=0.0, activation_dropout=0.0, layerdrop=0.0, "
                "max_position_embeddings=32, use_cache=False)"
            ),
            cls="BioGptForCausalLM",
        ),
        (2, 4),
        "biogpt.layers.",
        6,
        package="transformers.models.biogpt",
        model="BioGptForCausalLM",
    ),
    CorpusModel(
        "hf_xglm",  # sinusoidal positions built in forward
        HF_PACKAGES,
        "transformers/models/xglm/modeling_xglm.py",
        HF_LM_EXAMPLE.format(
            config=(
                "XGLMConfig(vocab_size=64, d_model=32, num_layers=6, attention_heads=4, "
                "ffn_dim=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, "
                "layerdrop=0.0, max_position_embeddings=32, use_cache=False)"
            ),
            cls="XGLMForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.xglm",
        model="XGLMForCausalLM",
    ),
    CorpusModel(
        "hf_bigcode",  # multi-query attention
        HF_PACKAGES,
        "transformers/models/gpt_bigcode/modeling_gpt_bigcode.py",
        HF_LM_EXAMPLE.format(
            config=(
                "GPTBigCodeConfig(vocab_size=64, n_embd=32, n_layer=6, n_head=4, "
                "n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, "
                "use_cache=False)"
            ),
            cls="GPTBigCodeForCausalLM",
        ),
        (2, 4),
        "transformer.h.",
        6,
        package="transformers.models.gpt_bigcode",
        model="GPTBigCodeForCausalLM",
    ),
    CorpusModel(
        "hf_stablelm",  # partial rotary, parallel residual off
        HF_PACKAGES,
        "transformers/models/stablelm/modeling_stablelm.py",
        HF_LM_EXAMPLE.format(
            config=(
                "StableLmConfig(vocab_size=64, hidden_size=32, num_hidden_layers=6, "
                "num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, "
                "max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0, "
                "use_cache=False)"
            ),
            cls="StableLmForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.stablelm",
        model="StableLmForCausalLM",
    ),
)


#: The same libraries as shipped in other versions and configs, and whole encoder-decoders:
#: Hugging Face's 4.x releases (whose base models return tuples with ``return_dict=False``
#: and take their inputs by keyword), T5 and Whisper whole, esm2's per-layer dicts, and a
#: ResNet whose batch leaves a batch norm one value per channel at one image a micro-batch.
#: They share the Flax models' transformers 4.57 install and run in fresh processes.
HF4_PACKAGES = FLAX_HF_PACKAGES

HF4_BERT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, return_dict=False,
    )
    return BertModel(config), (torch.randint(0, 64, (8, 16)),)
"""

HF4_GPT2_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=6, n_head=4, n_embd=32, n_positions=32, vocab_size=64, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        return_dict=False,
    )
    return GPT2Model(config), (torch.randint(0, 64, (8, 16)),)
"""

HF4_LLAMA_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        use_cache=False, return_dict=False,
    )
    return LlamaModel(config), (torch.randint(0, 64, (8, 16)),)
"""

HF4_T5_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=3,
        num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, use_cache=False,
    )
    tokens, decoder_tokens = torch.randint(1, 64, (8, 12)), torch.randint(1, 64, (8, 10))
    return T5Model(config), (tokens, torch.ones(8, 12, dtype=torch.long), decoder_tokens)
"""

HF4_WHISPER_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=64, num_mel_bins=8, encoder_layers=3, decoder_layers=3, d_model=32,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, use_cache=False, pad_token_id=0,
        decoder_start_token_id=1,
    )
    features, decoder_tokens = torch.randn(8, 8, 32), torch.randint(1, 64, (8, 10))
    return WhisperModel(config), (features, None, decoder_tokens)
"""

HF4_MODERNBERT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, max_position_embeddings=64, global_attn_every_n_layers=3,
        local_attention=8, embedding_dropout=0.0, mlp_dropout=0.0, attention_dropout=0.0,
        pad_token_id=0, reference_compile=False,
    )
    return ModernBertModel(config), (torch.randint(1, 64, (8, 16)),)
"""

ESM2_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = ESM2(num_layers=6, embed_dim=32, attention_heads=4, alphabet="ESM-1b")
    tokens = torch.randint(4, 24, (8, 16))
    tokens[:, 0] = model.cls_idx
    return model, (tokens,)
"""

#: resnet18 at batch 8: 8 micro-batches at 4 stages would give layer4's batch norms (1x1 maps
#: at 32x32) one value per channel; the default count keeps two images a micro-batch.
RESNET18_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return model, (images,), labels, nn.functional.cross_entropy
"""

#: x-transformers' ``TransformerWrapper`` around a ``Decoder``: the stack handed to its
#: ``__init__``, called through a local function, whose loop runs per-layer tuples it builds
#: (``enumerate(zip(*layer_variables))``); attention and feed-forward layers alternate.
XT_PACKAGES = (
    "x-transformers==2.31.10",
    "einops==0.8.2",
    "einx==0.4.3",
    "frozendict==2.5.1",
    "loguru==0.7.3",
    "torch-einops-utils==0.2.0",
)

XT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    model = TransformerWrapper(
        num_tokens=256, max_seq_len=64, attn_layers=Decoder(dim=64, depth=6, heads=4)
    )
    return model, (torch.randint(0, 256, (8, 64)),)
"""

VARIANTS = (
    CorpusModel(
        "hf4_bert",
        HF4_PACKAGES,
        "transformers/models/bert/modeling_bert.py",
        HF4_BERT_EXAMPLE,
        (2, 4),
        "encoder.layer.",
        6,
        package="transformers.models.bert",
        model="BertModel",
    ),
    CorpusModel(
        "hf4_gpt2",
        HF4_PACKAGES,
        "transformers/models/gpt2/modeling_gpt2.py",
        HF4_GPT2_EXAMPLE,
        (2, 4),
        "h.",
        6,
        package="transformers.models.gpt2",
        model="GPT2Model",
    ),
    CorpusModel(
        "hf4_llama",
        HF4_PACKAGES,
        "transformers/models/llama/modeling_llama.py",
        HF4_LLAMA_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        package="transformers.models.llama",
        model="LlamaModel",
    ),
    CorpusModel(
        "hf4_t5",
        HF4_PACKAGES,
        "transformers/models/t5/modeling_t5.py",
        HF4_T5_EXAMPLE,
        (2, 4),
        ("encoder.block.", "decoder.block."),
        6,
        package="transformers.models.t5",
        model="T5Model",
    ),
    CorpusModel(
        "hf4_whisper",
        HF4_PACKAGES,
        "transformers/models/whisper/modeling_whisper.py",
        HF4_WHISPER_EXAMPLE,
        (2, 4),
        ("encoder.layers.", "decoder.layers."),
        6,
        package="transformers.models.whisper",
        model="WhisperModel",
    ),
    CorpusModel(
        "hf4_modernbert",
        HF4_PACKAGES,
        "transformers/models/modernbert/modeling_modernbert.py",
        HF4_MODERNBERT_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        package="transformers.models.modernbert",
        model="ModernBertModel",
    ),
    CorpusModel(
        "esm2",
        ("fair-esm==2.0.0",),
        "esm/model/esm2.py",
        ESM2_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        unused=2,  # the contact head's regression, which only return_contacts=True runs
    ),
    CorpusModel(
        "x_transformers",
        XT_PACKAGES,
        "x_transformers/x_transformers.py",
        XT_EXAMPLE,
        (2, 4),
        "attn_layers.layers.",
        12,
        kinds=2,
        model="TransformerWrapper",
    ),
    CorpusModel(
        "tv_resnet18_b8",
        TORCHVISION_PACKAGES,
        "torchvision/models/resnet.py",
        RESNET18_EXAMPLE,
        (2, 4),
        "layer",
        8,
        package="torchvision.models",
        until="def _resnet(",
        preamble=TORCHVISION_PREAMBLE,
    ),
)


#: BART whole: encoder and decoder, the LM head over the decoder's tokens.
BART_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=64, d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0, use_cache=False, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )
    tokens, decoder_tokens = torch.randint(3, 64, (8, 12)), torch.randint(3, 64, (8, 11))
    inputs = (tokens, torch.ones(8, 12, dtype=torch.long), decoder_tokens[:, :-1])

    def loss(output, targets):
        logits = output.logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return BartForConditionalGeneration(config), inputs, decoder_tokens[:, 1:], loss
"""

#: A Hugging Face image classifier of ``cls`` from a tiny ``config``, on 16 images of
#: {size}x{size}.
HF_IMAGE_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = {config}
    images, labels = torch.randn(16, 3, {size}, {size}), torch.randint(0, 10, (16,))

    def loss(output, targets):
        return nn.functional.cross_entropy(output.logits, targets)

    return {cls}(config), (images,), labels, loss
"""

#: HuBERT on 8 clips of 800 samples: a convolutional feature encoder, a convolutional position
#: embedding, then the layers. SpecAugment's masking off (it draws at random in training).
HUBERT_EXAMPLE = """

def example():
    torch.manual_seed(0)
    config = HubertConfig(
        hidden_size=32, num_hidden_layers=6, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, hidden_dropout=0.0, activation_dropout=0.0,
        attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
        mask_time_prob=0.0, mask_feature_prob=0.0, num_labels=10, classifier_proj_size=16,
    )
    audio, labels = torch.randn(8, 800), torch.randint(0, 10, (8,))

    def loss(output, targets):
        return nn.functional.cross_entropy(output.logits, targets)

    return HubertForSequenceClassification(config), (audio,), labels, loss
"""

#: torchtune's Llama 3.2 builder, shrunk; its parts are put in the copy's TransformerDecoder
#: (the builder makes the installed module's). Tied embeddings, as Llama 3.2 has.
TORCHTUNE_EXAMPLE = """

from torchtune.models.llama3_2 import llama3_2


def example():
    torch.manual_seed(0)
    built = llama3_2(
        vocab_size=64, num_layers=6, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32,
        intermediate_dim=64,
    )
    model = TransformerDecoder(
        tok_embeddings=built.tok_embeddings, layers=built.layers, max_seq_len=32, num_heads=4,
        head_dim=8, norm=built.norm, output=built.output,
    )
    tokens = torch.randint(0, 64, (8, 17))

    def loss(logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return model, (tokens[:, :-1],), tokens[:, 1:], loss
"""

#: torchtitan's Llama 3 at 6 layers of width 32, its layers built as its own registry builds
#: them. FlexAttention, its language models' attention, has no backward on CPU: each layer's
#: inner attention is swapped for causal SDPA, as torchtitan's graph_trainer tests do.
TORCHTITAN_EXAMPLE = """

from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3 import _build_llama3_layers


def example():
    torch.manual_seed(0)
    layers = _build_llama3_layers(
        n_layers=6, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=8, max_seq_len=32, theta=500000.0),
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config = Llama3Model.Config(
        dim=32, vocab_size=64, layers=layers, norm=RMSNorm.Config(normalized_shape=32),
        tok_embeddings=Embedding.Config(num_embeddings=64, embedding_dim=32),
        lm_head=Linear.Config(in_features=32, out_features=64),
    )
    model = config.build()
    model.init_states()
    tokens = torch.randint(0, 64, (8, 17))

    def loss(logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return model, (tokens[:, :-1],), tokens[:, 1:], loss
"""

_HF_ENC = (
    "vocab_size=64, hidden_size=32, num_hidden_layers=6, num_attention_heads=4, "
    "intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, "
    "num_labels=10, "
)
_HF_TOKENS = "pad_token_id=0, bos_token_id=0, eos_token_id=0"

#: A fourth batch, first tried after the changes of issue 26 (the third batch of HELD_OUT, and
#: VARIANTS) had landed, with no test of syncpass written against them: other Hugging Face
#: architectures (an encoder-decoder whole, encoders, decoders, a convolutional image model,
#: speech), other timm families, torchtune's and torchtitan's Llama (``--fourth-batch``). Their
#: table, with the construct that stops each one that does not split or verify, is in
#: docs/stages.md; tests/test_corpus.py does not run them.
FOURTH_BATCH = (
    CorpusModel(
        "hf_bart",  # encoder and decoder whole, cross-attention, learned positions offset by 2
        HF_PACKAGES,
        "transformers/models/bart/modeling_bart.py",
        BART_EXAMPLE,
        (2, 4),
        ("model.encoder.layers.", "model.decoder.layers."),
        6,
        package="transformers.models.bart",
        model="BartForConditionalGeneration",
    ),
    CorpusModel(
        "hf_roberta",  # position ids made from the tokens past the padding index
        HF_PACKAGES,
        "transformers/models/roberta/modeling_roberta.py",
        HF_CLS_EXAMPLE.format(
            config=f"RobertaConfig({_HF_ENC}max_position_embeddings=40, pad_token_id=1)",
            cls="RobertaForSequenceClassification",
        ),
        (2, 4),
        "roberta.encoder.layer.",
        6,
        package="transformers.models.roberta",
        model="RobertaForSequenceClassification",
    ),
    CorpusModel(
        "hf_electra",  # embeddings narrower than the layers, projected up
        HF_PACKAGES,
        "transformers/models/electra/modeling_electra.py",
        HF_CLS_EXAMPLE.format(
            config=f"ElectraConfig({_HF_ENC}embedding_size=16, max_position_embeddings=32, "
            "pad_token_id=0)",
            cls="ElectraForSequenceClassification",
        ),
        (2, 4),
        "electra.encoder.layer.",
        6,
        package="transformers.models.electra",
        model="ElectraForSequenceClassification",
    ),
    CorpusModel(
        "hf_deberta_v2",  # disentangled attention: relative embeddings handed to every layer
        HF_PACKAGES,
        "transformers/models/deberta_v2/modeling_deberta_v2.py",
        HF_CLS_EXAMPLE.format(
            config=f"DebertaV2Config({_HF_ENC}max_position_embeddings=32, relative_attention=True, "
            "position_buckets=16, pos_att_type=['p2c', 'c2p'], pooler_dropout=0.0, "
            "pad_token_id=0)",
            cls="DebertaV2ForSequenceClassification",
        ),
        (2, 4),
        "deberta.encoder.layer.",
        6,
        package="transformers.models.deberta_v2",
        model="DebertaV2ForSequenceClassification",
    ),
    CorpusModel(
        "hf_qwen3",  # query and key norms per head
        HF_PACKAGES,
        "transformers/models/qwen3/modeling_qwen3.py",
        HF_LM_EXAMPLE.format(
            config=f"Qwen3Config({_HF_LM}{_HF_HEADS}head_dim=8, use_cache=False, "
            "tie_word_embeddings=True)",
            cls="Qwen3ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.qwen3",
        model="Qwen3ForCausalLM",
    ),
    CorpusModel(
        "hf_olmo2",  # norms after attention and MLP, query and key norms
        HF_PACKAGES,
        "transformers/models/olmo2/modeling_olmo2.py",
        HF_LM_EXAMPLE.format(
            config=f"Olmo2Config({_HF_LM}{_HF_HEADS}use_cache=False, {_HF_TOKENS})",
            cls="Olmo2ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.olmo2",
        model="Olmo2ForCausalLM",
    ),
    CorpusModel(
        "hf_granite",  # embedding, residual, attention and logit multipliers
        HF_PACKAGES,
        "transformers/models/granite/modeling_granite.py",
        HF_LM_EXAMPLE.format(
            config=f"GraniteConfig({_HF_LM}{_HF_HEADS}embedding_multiplier=2.0, "
            "residual_multiplier=0.5, attention_multiplier=0.25, logits_scaling=2.0, "
            f"use_cache=False, {_HF_TOKENS})",
            cls="GraniteForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.granite",
        model="GraniteForCausalLM",
    ),
    CorpusModel(
        "hf_phi",  # Phi-2: parallel attention and MLP, partial rotary, one LayerNorm a block
        HF_PACKAGES,
        "transformers/models/phi/modeling_phi.py",
        HF_LM_EXAMPLE.format(
            config=f"PhiConfig({_HF_LM}num_attention_heads=4, max_position_embeddings=32, "
            "partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, "
            f"use_cache=False, {_HF_TOKENS})",
            cls="PhiForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.phi",
        model="PhiForCausalLM",
    ),
    CorpusModel(
        "hf_smollm3",  # rotary left out of every fourth layer (no_rope_layers)
        HF_PACKAGES,
        "transformers/models/smollm3/modeling_smollm3.py",
        HF_LM_EXAMPLE.format(
            config=f"SmolLM3Config({_HF_LM}{_HF_HEADS}use_cache=False, {_HF_TOKENS})",
            cls="SmolLM3ForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.smollm3",
        model="SmolLM3ForCausalLM",
    ),
    CorpusModel(
        "hf_cohere",  # parallel attention and MLP, interleaved rotary, scaled logits
        HF_PACKAGES,
        "transformers/models/cohere/modeling_cohere.py",
        HF_LM_EXAMPLE.format(
            config=f"CohereConfig({_HF_LM}{_HF_HEADS}use_cache=False, {_HF_TOKENS})",
            cls="CohereForCausalLM",
        ),
        (2, 4),
        "model.layers.",
        6,
        package="transformers.models.cohere",
        model="CohereForCausalLM",
    ),
    CorpusModel(
        "hf_convnextv2",  # four stages of blocks with global response norm
        HF_PACKAGES,
        "transformers/models/convnextv2/modeling_convnextv2.py",
        HF_IMAGE_EXAMPLE.format(
            config="ConvNextV2Config(num_channels=3, patch_size=4, hidden_sizes=[16, 32, 64, 128], "
            "depths=[2, 2, 2, 2], drop_path_rate=0.0, num_labels=10, image_size=64)",
            cls="ConvNextV2ForImageClassification",
            size=64,
        ),
        (2, 4),
        "convnextv2.encoder.stages.",
        4,
        package="transformers.models.convnextv2",
        model="ConvNextV2ForImageClassification",
    ),
    CorpusModel(
        "hf_hubert",  # convolutional feature encoder and position embedding, then the layers
        HF_PACKAGES,
        "transformers/models/hubert/modeling_hubert.py",
        HUBERT_EXAMPLE,
        (2, 4),
        "hubert.encoder.layers.",
        6,
        package="transformers.models.hubert",
        model="HubertForSequenceClassification",
    ),
    CorpusModel(
        # timm's own ResNet: BatchNorm, a downsampling block at each stage. It starts each
        # block's last BatchNorm at zero, which leaves its convolutions' gradients zero: verify
        # would compare zeros, so the example starts them at one (zero_init_last=False).
        "timm_resnet",
        TIMM_PACKAGES,
        "timm/models/resnet.py",
        VISION16_EXAMPLE.format(
            build="ResNet(BasicBlock, (2, 2, 2, 2), num_classes=10, drop_rate=0.0, "
            "zero_init_last=False)",
            size=64,
        ),
        (2, 4),
        "layer",
        8,
        2,
        package="timm.models",
        until="def _create_resnet(",
        preamble=TORCHVISION_PREAMBLE,
        model="ResNet",
    ),
    CorpusModel(
        "timm_beit",  # relative position bias in every block, layer scale
        TIMM_PACKAGES,
        "timm/models/beit.py",
        VISION_EXAMPLE.format(
            build="Beit(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=6, "
            "num_heads=4, use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1)",
            size=32,
        ),
        (2, 4),
        "blocks.",
        6,
        package="timm.models",
        until="def _create_beit(",
        preamble=TORCHVISION_PREAMBLE,
        model="Beit",
    ),
    CorpusModel(
        "timm_cait",  # two stacks: self-attention blocks, then class-attention blocks
        TIMM_PACKAGES,
        "timm/models/cait.py",
        VISION_EXAMPLE.format(
            build="Cait(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=6, "
            "num_heads=4, depth_token_only=2)",
            size=32,
        ),
        (2, 4),
        ("blocks.", "blocks_token_only."),
        8,
        2,
        package="timm.models",
        until="def _create_cait(",
        preamble=TORCHVISION_PREAMBLE,
        model="Cait",
    ),
    CorpusModel(
        "timm_pvt_v2",  # four stages of spatial-reduction attention, overlapping patch embeds
        TIMM_PACKAGES,
        "timm/models/pvt_v2.py",
        VISION_EXAMPLE.format(
            build="PyramidVisionTransformerV2(depths=(2, 2, 2, 2), embed_dims=(16, 32, 64, 128), "
            "num_heads=(1, 2, 4, 8), num_classes=10, drop_rate=0.0, drop_path_rate=0.0)",
            size=64,
        ),
        (2, 4),
        "stages.",
        4,
        package="timm.models",
        until="def _create_pvt2(",
        preamble=TORCHVISION_PREAMBLE,
        model="PyramidVisionTransformerV2",
    ),
    CorpusModel(
        "timm_eva",  # rotary position embedding over the patch grid, handed to every block
        TIMM_PACKAGES,
        "timm/models/eva.py",
        VISION_EXAMPLE.format(
            build="Eva(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=6, "
            "num_heads=4, use_rot_pos_emb=True)",
            size=32,
        ),
        (2, 4),
        "blocks.",
        6,
        package="timm.models",
        until="def _create_eva(",
        preamble=TORCHVISION_PREAMBLE,
        model="Eva",
    ),
    CorpusModel(
        "torchtune_llama3_2",  # TransformerDecoder: a layer loop that may collect hidden states
        TORCHTUNE_PACKAGES,
        "torchtune/modules/transformer.py",
        TORCHTUNE_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        model="TransformerDecoder",
    ),
    CorpusModel(
        "titan_llama3",  # forward inherited from torchtitan's Decoder, layers in a ModuleDict
        TORCHTITAN_PACKAGES,
        "torchtitan/models/llama3/model.py",
        TORCHTITAN_EXAMPLE,
        (2, 4),
        "layers.",
        6,
        model="Llama3Model",
    ),
)


#: The held-out models whose first try found a bug in syncpass.
TESTED_HELD_OUT = (
    "hf_qwen2",
    "hf_opt",
    "hf_vit",
    "timm_convnext",
    "tv_vit",
    "tv_regnet",
    "hf_gemma3",
    "hf_bloom",
    "timm_deit",
)


def install(packages: tuple[str, ...], folder: Path) -> Path:
    """``packages`` installed into ``folder`` (once: a folder that has them is kept)."""
    marker = folder / ".installed"
    if marker.exists() and marker.read_text() == "\n".join(packages):
        return folder
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--disable-pip-version-check", "--target", str(folder), *packages]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"installing {' '.join(packages)} failed: {done.stderr}")
    marker.write_text("\n".join(packages))
    return folder


def project(installed: Path, model: CorpusModel, folder: Path) -> Path:
    """The model's source copied into ``folder`` beside (links to) its packages, with its
    example appended."""
    for entry in installed.iterdir():
        target = folder / entry.name
        if entry.is_dir() and not target.exists():
            target.symlink_to(entry, target_is_directory=True)
    source = folder / f"{model.name}.py"
    text = (installed / model.source).read_text()
    if model.until:
        text = text[: text.index(f"\n{model.until}") + 1]
    if model.package:
        text = absolute_imports(text, model.package)
    source.write_text(model.preamble + text + model.example)
    return source


def prepared(model: CorpusModel, packages: Path, folder: Path) -> Path:
    """``model``'s project in ``folder``, its packages installed under ``packages`` (one
    folder per set, named after its first package and its version, so models that share a
    set share it)."""
    installed = install(model.packages, packages / model.packages[0].replace("==", "-"))
    return project(installed, model, folder)


def absolute_imports(text: str, package: str) -> str:
    """``text`` (a module of ``package``) with its relative imports made absolute: ``from
    ..utils import x`` in ``a.b.c`` becomes ``from a.b.utils import x``. Nothing else changes."""
    parts = package.split(".")

    def absolute(match: re.Match[str]) -> str:
        indent, dots, rest = match.group(1), match.group(2), match.group(3)
        base = parts[: len(parts) - (len(dots) - 1)]
        return f"{indent}from {'.'.join([*base, rest] if rest else base)} import"

    # Indented too: an import under `if is_torch_flex_attn_available():` (T5).
    return re.sub(r"^([ \t]*)from (\.+)(\S*) import", absolute, text, flags=re.MULTILINE)


def _quiet(
    argv: list[str],
    isolated: bool = False,
    cwd: Path | None = None,
    environment: dict[str, str] | None = None,
) -> tuple[int, str]:
    """``syncpass ARGV``'s exit status and error output (in a fresh process in ``cwd``, the
    model's project, with ``environment`` added, if ``isolated``: ``python -m`` puts its
    folder first on the path)."""
    if isolated:
        done = subprocess.run(
            [sys.executable, "-m", "syncpass", *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=cwd,
            env={**os.environ, **(environment or {})},
        )
        return done.returncode, done.stderr
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = syncpass(argv)
    return status, err.getvalue()


def _plan(costs: Path, stages: int, backend: str, strategy: str = "adaptive") -> dict | None:  # type: ignore[type-arg]
    out = costs.with_suffix(f".{backend}.{strategy}.{stages}.plan.json")
    argv = ["plan", "--costs", str(costs), "--stages", str(stages), "--backend", backend]
    status, _ = _quiet([*argv, "--strategy", strategy, "--no-baselines", "-o", str(out)])
    return json.loads(out.read_text()) if status == 0 else None


def _ms(plan: dict | None) -> str:  # type: ignore[type-arg]
    return "-" if plan is None else f"{plan['predicted_step_s'] * 1e3:.1f} ms"


def _forms(model: CorpusModel) -> tuple[str, ...]:
    """The backends ``model`` is profiled for: its own, and for torch the ``pipe_split()``
    form as written, for comparison."""
    return ("torch_stages", "torch") if model.backend == "torch_stages" else (model.backend,)


def bench(models: list[CorpusModel], steps: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        header = (
            f"{'model':<11} {'ops':>9} {'stages':>6} {'syncpass':>9} {'uniform':>11} "
            f"{'speedup':>7} {'pipe_split':>10} {'measured':>9}  verify"
        )
        print(header)
        for model in models:
            folder = root / model.name
            folder.mkdir()
            source = prepared(model, root, folder)
            example = f"{source}:example"
            model_flag = ["--model", model.model] if model.model else []
            counts = {}
            failed = ""
            for backend in _forms(model):
                costs = folder / f"{backend}.costs.json"
                argv = ["profile", str(source), "--example", example, "--backend", backend]
                status, err = _quiet(
                    [*argv, *model_flag, "-o", str(costs)],
                    model.isolated,
                    folder,
                    model.environment,
                )
                if status != 0 and backend == model.backend:
                    failed = err.strip().splitlines()[-1] if err.strip() else f"status {status}"
                    break
                if status == 0:
                    counts[backend] = len(json.loads(costs.read_text())["ops"])
            if failed:  # a model the pass refuses is a row of the table too
                print(f"{model.name:<11} profile failed: {failed}", flush=True)
                continue
            for stages in model.stages:
                own_costs = folder / f"{model.backend}.costs.json"
                ours = _plan(own_costs, stages, model.backend)
                rule = _plan(own_costs, stages, model.backend, "uniform")
                traced = (
                    _plan(folder / "torch.costs.json", stages, "torch")
                    if "torch" in counts
                    else None
                )
                speedup = (
                    f"{rule['predicted_step_s'] / ours['predicted_step_s']:.2f}x"
                    if ours is not None and rule is not None
                    else "-"
                )
                out = folder / f"sync_{stages}.py"
                argv = ["rewrite", str(source), "--costs", str(own_costs), "--stages", str(stages)]
                status, err = _quiet(
                    [*argv, *model.model_arguments(), "-o", str(out)],
                    model.isolated,
                    folder,
                    model.environment,
                )
                measured, verified = "-", "rewrite failed"
                if status == 0:
                    report = folder / f"run_{stages}.json"
                    argv = ["run", str(out), "--stages", str(stages), "--verify"]
                    argv += ["--backend", model.backend]
                    argv += ["--steps", str(steps), "--json-report", str(report)]
                    status, err = _quiet(argv, model.isolated, folder, model.environment)
                    if report.exists():
                        document = json.loads(report.read_text())
                        slowest = max(stage["step_s"] for stage in document["stage_reports"])
                        measured = f"{slowest * 1e3:.1f} ms"
                        verify = document["verify"]
                        verified = (
                            f"ok ({verify['parameters_compared']} gradients)"
                            if verify["ok"]
                            else "MISMATCH"
                        )
                    else:
                        verified = f"run failed: {err.strip().splitlines()[-1] if err else status}"
                ops = "/".join(str(counts.get(form, "-")) for form in ("torch_stages", "torch"))
                if model.backend != "torch_stages":
                    ops = f"{counts[model.backend]}/-"
                print(
                    f"{model.name:<11} {ops:>9} {stages:>6} {_ms(ours):>9} {_ms(rule):>11} "
                    f"{speedup:>7} {_ms(traced):>10} {measured:>9}  {verified}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated names (default: all)")
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="the models first tried with no test written against them (HELD_OUT)",
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="other versions and configs of the same libraries, and encoder-decoders (VARIANTS)",
    )
    parser.add_argument(
        "--fourth-batch",
        action="store_true",
        help="models first tried after the issue-26 changes landed (FOURTH_BATCH)",
    )
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    models = (
        HELD_OUT
        if args.held_out
        else VARIANTS
        if args.variants
        else FOURTH_BATCH
        if args.fourth_batch
        else MODELS
    )
    wanted = args.models.split(",") if args.models else [model.name for model in models]
    bench([model for model in models if model.name in wanted], args.steps)


if __name__ == "__main__":
    main()
