"""The lm-eval model ``kvquant-hf``: a Hugging Face causal LM whose attention reads a KV cache.

Scoring modes for loglikelihood and rolling perplexity:
- ``single-pass``: one forward over context + continuation, as lm-eval's HF model does. Whether
  it sees quantized K/V depends on ``prefill_reads_cache``.
- ``decode``: the context minus its last token is prefilled, then that token and the
  continuation are fed one at a time (teacher-forced), so every continuation token's
  log-probability comes from a query that attended to the cached, quantized K/V. A request
  whose prefill equals the previous one's (the choices of a multiple-choice item) reuses the
  cached prefill: the same tokens at the same positions would write the same K/V.

Generation is greedy: prefill, then one cached decode step per new token.
Sequences run one at a time; each result goes to lm-eval's cache as soon as it is known, so an
interrupted run resumes without redoing finished requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

# lm-eval and tqdm ship no type information.
from lm_eval.api.model import TemplateLM  # type: ignore[import-untyped]
from lm_eval.api.registry import register_model  # type: ignore[import-untyped]
from lm_eval.utils import (  # type: ignore[import-untyped]
    get_rolling_token_windows,
    make_disjoint_window,
)
from tqdm import tqdm  # type: ignore[import-untyped]

from ._errors import AccuracyError
from ._hf_model import forward, load_model, model_session
from ._kv_attention import KVSession, cache_storage

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance  # type: ignore[import-untyped]
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SCORE_MODES = ("single-pass", "decode")
_DEFAULT_MAX_GEN_TOKS = 256


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    msg = f"`{name}` is {value!r}; expected true or false"
    raise AccuracyError(msg)


@register_model("kvquant-hf")
class KVQuantHFLM(TemplateLM):  # type: ignore[misc]  # TemplateLM is untyped
    """lm-eval model over a Hugging Face causal LM with a kvquant (or emulated fp8) KV cache.

    Model args (``--model_args`` strings or keywords): ``pretrained`` (HF folder or .gguf; the
    default SmolLM2 if empty), ``kv_cache_dtype`` (auto | int8 | fp8_e4m3),
    ``prefill_reads_cache`` (default true), ``score_mode`` (single-pass | decode), ``device``,
    ``dtype``, ``max_length``, ``progress``. Pass ``loaded=(model, tokenizer)`` to share
    weights between runs.
    """

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        kv_cache_dtype: str = "auto",
        prefill_reads_cache: bool | str = True,
        score_mode: str = "single-pass",
        device: str = "cpu",
        dtype: str = "auto",
        max_length: int | str = 2048,
        loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
        progress: bool = True,
        **_unused_lm_eval_args: Any,
    ) -> None:
        super().__init__()
        if score_mode not in SCORE_MODES:
            msg = f"`score_mode` is {score_mode!r}; expected one of {', '.join(SCORE_MODES)}"
            raise AccuracyError(msg)
        model, tokenizer = (
            loaded if loaded is not None else load_model(pretrained or None, device, dtype)
        )
        cache_storage(kv_cache_dtype, model.dtype)  # rejects an unknown name before any work
        self.model = model
        self.tokenizer = tokenizer
        self.kv_cache_dtype = kv_cache_dtype
        self.score_mode = score_mode
        self.max_length = int(max_length)
        self.progress = progress
        self._session: KVSession = model_session(
            model,
            kv_cache_dtype=kv_cache_dtype,
            prefill_reads_cache=_parse_bool("prefill_reads_cache", prefill_reads_cache),
            max_tokens=self.max_length,
        )
        # Tokens at positions 0... of the cache from the last decode-mode prefill; None once
        # anything else may have overwritten them.
        self._prefilled: list[int] | None = None

    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise AccuracyError("tokenizer has no single `eos_token_id`; expected one token id")
        return eos

    @property
    def prefix_token_id(self) -> int:
        """The token a rolling window's first token is scored after: BOS where the tokenizer
        has one, as lm-eval's HF and vllm models do, else the end-of-text token (lm-eval's
        default). Another prefix would shift the baseline's perplexity itself."""
        bos = self.tokenizer.bos_token_id
        return bos if isinstance(bos, int) else self.eot_token_id

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        ids: list[int] = self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))
        return ids

    # ---- forward through the cache ----

    def _forward(self, tokens: Sequence[int], logits_to_keep: int) -> torch.Tensor:
        """Run ``tokens`` at the cache's next positions; fp32 logits of the last few rows."""
        return forward(self.model, self._session, tokens, logits_to_keep)

    def _restart(self) -> None:
        """Make the next forward write from position 0."""
        self._session.length = 0
        self._prefilled = None

    def _prefill(self, tokens: list[int]) -> None:
        """Hold ``tokens`` at positions 0... of the cache, ready for the next position.

        Later decode steps write only past ``tokens``, so a prefill stays valid until a request
        with other tokens, a single-pass score or a generation starts again at position 0.
        """
        if tokens != self._prefilled:
            self._restart()
            if tokens:
                self._forward(tokens, logits_to_keep=1)
            self._prefilled = tokens
        self._session.length = len(tokens)

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Sum of log p(continuation | context) and whether greedy decoding reproduces it."""
        whole = (context + continuation)[-(self.max_length + 1) :]
        inputs = whole[:-1]
        n = len(continuation)
        if self.score_mode == "single-pass":
            self._restart()
            logits = self._forward(inputs, logits_to_keep=n)
        else:
            prefill = inputs[: len(inputs) - n]
            self._prefill(prefill)
            rows = [self._forward([token], logits_to_keep=1) for token in inputs[len(prefill) :]]
            logits = torch.cat(rows)
        log_probs = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation, device=log_probs.device)
        total = float(log_probs.gather(1, target[:, None]).sum())
        greedy = bool((log_probs.argmax(dim=-1) == target).all())
        return total, greedy

    # ---- lm-eval request types ----

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        results = []
        for key, context, continuation in tqdm(
            requests,
            desc=f"loglikelihood {self._label()}",
            disable=disable_tqdm or not self.progress,
        ):
            result = self._score(context, continuation)
            self.cache_hook.add_partial("loglikelihood", key, result)
            results.append(result)
        return results

    def loglikelihood_rolling(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[float]:
        results = []
        for request in tqdm(
            requests,
            desc=f"rolling loglikelihood {self._label()}",
            disable=disable_tqdm or not self.progress,
        ):
            (text,) = request.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            total = 0.0
            for window in windows:
                context, continuation = make_disjoint_window(window)
                total += self._score(list(context), list(continuation))[0]
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            results.append(total)
        return results

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        results = []
        for request in tqdm(
            requests, desc=f"generate {self._label()}", disable=disable_tqdm or not self.progress
        ):
            context, gen_kwargs = request.args
            text = self._generate(context, dict(gen_kwargs))
            self.cache_hook.add_partial("generate_until", request.args, text)
            results.append(text)
        return results

    def _generate(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        """Greedy continuation of ``context``, cut at the first stop string."""
        until = gen_kwargs.get("until") or []
        stops = [until] if isinstance(until, str) else list(until)
        stops.append(self.tokenizer.decode([self.eot_token_id]))
        max_new = int(gen_kwargs.get("max_gen_toks", _DEFAULT_MAX_GEN_TOKS))
        prompt = self.tok_encode(context)[-(self.max_length - max_new) :]
        self._restart()
        logits = self._forward(prompt, logits_to_keep=1)
        generated: list[int] = []
        text = ""
        for _ in range(max_new):
            token = int(logits[-1].argmax())
            if token == self.eot_token_id:
                break
            generated.append(token)
            text = str(self.tokenizer.decode(generated))
            if any(stop in text for stop in stops):
                break
            logits = self._forward([token], logits_to_keep=1)
        for stop in stops:
            text = text.split(stop)[0]
        return text

    def _label(self) -> str:
        return f"{self.kv_cache_dtype}/{self.score_mode}"
