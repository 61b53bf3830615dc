"""The Engine API (the contract of DESIGN.md): from_pretrained, score, chat, stats, plan."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .checkpoint import Checkpoint
from .config import ModelConfig, load_model_config
from .env import read_env
from .errors import ContextLimitError, OptionError, QwenlocalError
from .events import EngineError, Event, ReasoningDelta, Stats, TokenDelta, TurnDone
from .load import load_weights
from .choices import (DTYPE_NAMES, TORCH_DTYPES, build_overlap, detect_software, hardware_profile, offload_bank, placement_of,
                      stored_dense_bytes)
from .engine_config import EngineConfig
from .memory import ModelFacts, ModelInfo
from .quant.scheme import NVFP4, parse_quant_scheme
from .offload.cache import ExpertSlotCache
from .offload.routing import RoutingSpec, RoutingTrace
from .model.kernels import select_kernels
from .resolve import resolve
from .model.qwen3_5_moe import Qwen35MoeModel
from .options import EngineOptions
from .runtime.generate import GenerationStats, generate_tokens
from .runtime.runner import Runner
from .runtime.session import Session
from .quant.synthetic_formats import stored_dense_bytes_of
from .synthetic import (is_synthetic, shared_synthetic, synthetic_config, synthetic_geometry, synthetic_nvfp4,
                        synthetic_tokenizer_dir)
from .runtime.sampler import SamplingParams, defaults_from_generation_config, eos_from_generation_config
from .think_split import reply_splitter
from .tokenizer import ChatTokenizer, StreamDecoder

log = logging.getLogger(__name__)
_ROLES = ("system", "user", "assistant", "tool")
_STATS_EVERY_S = 0.25
ProgressFn = Callable[[str, int, int], None]


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        use_cuda = torch.cuda.is_available() and not read_env().no_cuda
        return torch.device("cuda" if use_cuda else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError("device='cuda' was asked for but no CUDA GPU is visible to torch; use device='cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise OptionError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return dev


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise OptionError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise OptionError(f"messages[{i}] must be an object with 'role' and 'content'")
        if m.get("role") not in _ROLES:
            raise OptionError(f"messages[{i}].role is {m.get('role')!r}; use one of {', '.join(_ROLES)}")
        if not isinstance(m.get("content", ""), str):
            raise OptionError(f"messages[{i}].content must be a string")
        out.append(dict(m))
    return out


class Engine:
    def __init__(self, model_dir: Path, config: ModelConfig, model: Qwen35MoeModel, tokenizer: ChatTokenizer,
                 options: EngineOptions, sampling_defaults: SamplingParams, eos_ids: tuple[int, ...],
                 engine_config: EngineConfig):
        self.model_dir = model_dir
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.engine_config = engine_config  # every decision, resolved once (engine/resolve.py)
        self.sampling_defaults = sampling_defaults
        self.eos_ids = eos_ids
        self.max_context = engine_config.max_context
        self.runner = Runner(model, engine_config)
        self._busy = threading.Lock()
        self._placed: dict = {}
        self._last: GenerationStats | None = None
        self._totals = {"prompt_tokens": 0, "completion_tokens": 0, "turns": 0}

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device | None = None,
                        dtype: torch.dtype | None = None, vram_budget: str | int | None = None,
                        options: EngineOptions | Mapping[str, Any] | None = None,
                        progress: ProgressFn | None = None) -> "Engine":
        opts = EngineOptions.coerce(options, vram_budget=vram_budget)
        routing = RoutingSpec.from_value(opts.routing)  # a bad spec fails here, before any loading
        dev = _resolve_device(device)
        if dtype is not None and dtype not in DTYPE_NAMES:
            raise OptionError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
        synthetic = is_synthetic(path)
        # Everything cheap is read and validated before the weights: the model's facts, then one resolve.
        if synthetic:
            _, geometry, _ = synthetic_geometry(str(path))
            model_dir = Path(synthetic_tokenizer_dir(geometry))
            tokenizer = ChatTokenizer.from_dir(model_dir)
            padded_vocab = -(-tokenizer.vocab_size // 64) * 64
            config = synthetic_config(str(path), padded_vocab)
            nvfp4 = synthetic_nvfp4(str(path))  # the real checkpoint's formats: FP8/NVFP4 linears, NVFP4 experts
            info = ModelInfo.from_config(config, str(path), expert_format=NVFP4 if nvfp4 else "bf16",
                                         quantized_linears=nvfp4,
                                         stored_dense_bytes=stored_dense_bytes_of(config) if nvfp4 else None)
        else:
            model_dir = Path(path)
            config = load_model_config(model_dir)
            tokenizer = ChatTokenizer.from_dir(model_dir)
            ckpt = Checkpoint(model_dir)
            scheme = parse_quant_scheme(config.quantization)
            info = ModelInfo.from_config(config, model_dir.name, expert_format=scheme.format_of("layers.0.mlp.experts"),
                                         quantized_linears=scheme.quantized, stored_dense_bytes=stored_dense_bytes(ckpt))
        why = "" if device is not None else ("torch sees no CUDA GPU (or QWENLOCAL_NO_CUDA is set): the CPU path runs "
                                             "(slowly)" if dev.type == "cpu" else "")
        plan = resolve(opts, info, hardware_profile(dev), dev.type, detect_software(dev),
                       dtype=DTYPE_NAMES[dtype] if dtype is not None else None,
                       routing=routing.describe() if routing is not None else None,
                       device_asked=device is not None, device_why=why)
        log.info("engine config: %s", plan.summary())
        if plan.threads is not None:  # the CPU path: once here, before any weight work runs on the threads
            torch.set_num_threads(plan.threads)
        dtype = TORCH_DTYPES[plan.dtype]
        native = plan.experts == "nvfp4"
        if synthetic:
            make_bank = (lambda cfg: offload_bank(plan, cfg, dtype)) if plan.offloaded else None
            keep = plan.linears == "native"
            linears = (keep, keep and plan.linear_kernels, keep and plan.fp8_prefill == "scaled-mm")
            shared = shared_synthetic(str(path), dev, dtype, padded_vocab, make_bank, native, linears)
            config, weights, bank = shared.config, dict(shared.weights), shared.bank
        else:
            bank = offload_bank(plan, config, dtype)
            step = (lambda done, total: progress("weights", done, total)) if progress else None
            sink = None if bank is None else (bank.put_rows if native else bank.put)
            weights = load_weights(ckpt, config, dtype, dev, progress=step, expert_sink=sink, native_nvfp4=native,
                                   native_linears=plan.linears == "native", linear_kernels=plan.linear_kernels,
                                   fp8_scaled_mm=plan.fp8_prefill == "scaled-mm")
        placed = placement_of(weights, bank)
        cache = ExpertSlotCache(config, bank, plan.slots, dev) if bank is not None else None
        model = Qwen35MoeModel(config, weights, select_kernels(config, dev, dtype, plan.max_context, config=plan),
                               cache, build_overlap(plan, dev))
        if routing is not None:
            model.use_routing(RoutingTrace.from_spec(routing, config.num_layers, config.moe.num_experts,
                                                     config.moe.top_k, dev))
        eos = eos_from_generation_config(model_dir) or tokenizer.eos_token_ids or config.eos_token_ids
        engine = cls(model_dir, config, model, tokenizer, opts, defaults_from_generation_config(model_dir), eos, plan)
        engine._placed = placed
        engine._shared = shared if synthetic else None  # keeps a shared synthetic model alive
        return engine

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def plan(self) -> dict:
        """The resolved EngineConfig, rendered: decision -> {"value", "reason", "by"} (what runs, and why)."""
        return self.engine_config.render()

    def score(self, token_ids: Sequence[int] | torch.Tensor, prefill: int | None = None) -> torch.Tensor:
        """Teacher forcing: float32 logits [len, vocab]. prefill=K: the first K tokens through prefill (in
        chunks), the rest one at a time through the decode step."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        n = ids.shape[0]
        k = n if prefill is None else prefill
        if n == 0:
            raise OptionError("score needs at least one token")
        if not isinstance(k, int) or not 0 <= k <= n:
            raise OptionError(f"prefill must be an integer in [0, {n}], got {prefill!r}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise OptionError(f"token ids must be in [0, {self.config.vocab_size})")
        if n > self.max_context:
            raise ContextLimitError(f"{n} tokens exceed the context limit of {self.max_context}")
        with self._exclusive():
            ids = ids.to(self.device)
            state = self.runner.new_state()
            parts = [self.runner.prefill(state, ids[:k], all_logits=True)] if k else []
            parts += [self.runner.decode(state, ids[i:i + 1]) for i in range(k, n)]
            return torch.cat(parts).float().cpu()

    def new_session(self) -> Session:
        """A conversation whose turns reuse the cached state (pass it to chat(..., session=...))."""
        with self._exclusive():
            return Session(self.runner)

    def chat(self, messages: Sequence[Mapping[str, Any]], sampling: SamplingParams | Mapping[str, Any] | None = None,
             enable_thinking: bool = True, cancel: threading.Event | None = None,
             session: Session | None = None) -> Iterator[Event]:
        """Stream the assistant's reply as events. Bad input raises here, before any model work.

        With a session, only the tokens after what the session already holds are prefilled; regenerate and
        edit restore the session's turn snapshots instead of prefilling the history again."""
        msgs = validate_messages(messages)
        params = sampling if isinstance(sampling, SamplingParams) else self.sampling_defaults.updated(sampling)
        prompt_text = self.tokenizer.render(msgs, add_generation_prompt=True, enable_thinking=enable_thinking)
        prompt = self.tokenizer.encode(prompt_text)
        if len(prompt) + 1 > self.max_context:
            raise ContextLimitError(
                f"the conversation is {len(prompt)} tokens and the context limit is {self.max_context}: "
                "shorten it (drop earlier messages) or raise max_context if memory allows"
            )
        boundary = None
        if session is not None:
            history = self.tokenizer.encode(self.tokenizer.render(msgs, add_generation_prompt=False,
                                                                  enable_thinking=enable_thinking))
            boundary = len(history) if prompt[:len(history)] == history else None
        return self._stream(prompt, prompt_text, params, cancel, session, boundary, thinking=enable_thinking)

    def count_tokens(self, messages: Sequence[Mapping[str, Any]], enable_thinking: bool = True) -> int:
        """The size in tokens of the prompt `chat` would build from these messages (the context check's figure)."""
        msgs = validate_messages(messages)
        return len(self.tokenizer.encode(self.tokenizer.render(msgs, add_generation_prompt=True,
                                                               enable_thinking=enable_thinking)))

    def complete(self, prompt: str | Sequence[int], sampling: SamplingParams | Mapping[str, Any] | None = None,
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        """A raw prompt (text, or token ids) continued with no chat template and no thinking split: TokenDelta
        events, then TurnDone (its reasoning empty). Bad input raises here, before any model work."""
        params = sampling if isinstance(sampling, SamplingParams) else self.sampling_defaults.updated(dict(sampling or {}))
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise OptionError("the prompt encodes to no tokens")
        limit = self.tokenizer.vocab_size
        if not isinstance(prompt, str) and any(not 0 <= t < limit for t in ids):
            raise OptionError(f"prompt token ids must be in [0, {limit})")
        if len(ids) + 1 > self.max_context:
            raise ContextLimitError(f"the prompt is {len(ids)} tokens and the context limit is {self.max_context}")
        return self._stream(ids, "", params, cancel, raw=True)

    def _stream(self, prompt: list[int], prompt_text: str, params: SamplingParams,
                cancel: threading.Event | None, session: Session | None = None,
                boundary: int | None = None, raw: bool = False, thinking: bool = True) -> Iterator[Event]:
        stats = GenerationStats()
        # Think segments by token id (think_split.py); a raw completion has none.
        splitter = _NoSplit(self.tokenizer) if raw else reply_splitter(self.tokenizer, prompt_text, thinking)
        text, reasoning = [], []
        last_stats = time.perf_counter()
        with self._exclusive():
            try:
                if session is None:
                    state, prefill = self.runner.new_state(), None
                else:
                    state = session.sync()
                    prefill = lambda: session.prefill(prompt, boundary, cancel)  # noqa: E731
                generated: list[int] = []
                for token in generate_tokens(self.runner, state, prompt, params, self.eos_ids, stats, cancel,
                                             vocab_limit=self.tokenizer.vocab_size, prefill=prefill):
                    generated.append(token)
                    if token in self.eos_ids:
                        continue
                    for kind, piece in splitter.push(token):
                        (reasoning if kind == "reasoning" else text).append(piece)
                        yield ReasoningDelta(piece) if kind == "reasoning" else TokenDelta(piece)
                    if time.perf_counter() - last_stats > _STATS_EVERY_S:
                        last_stats = time.perf_counter()
                        yield Stats(self._live_stats(stats))
                for kind, piece in splitter.flush():
                    (reasoning if kind == "reasoning" else text).append(piece)
                    yield ReasoningDelta(piece) if kind == "reasoning" else TokenDelta(piece)
                if session is not None:
                    session.record_generated(generated)
                    stats.cached_tokens = session.last_reused
            except QwenlocalError as exc:
                yield EngineError(str(exc), type(exc).__name__)
                return
            except Exception as exc:  # a bug or a device fault: report it as an event, not a dead stream
                yield EngineError(f"generation failed: {exc!r}", type(exc).__name__)
                return
            self._last = stats
            self._totals["prompt_tokens"] += stats.prompt_tokens
            self._totals["completion_tokens"] += stats.completion_tokens
            self._totals["turns"] += 1
            yield TurnDone(stats.finish_reason, stats.prompt_tokens, stats.completion_tokens, "".join(text),
                           "".join(reasoning), self._live_stats(stats))

    def _live_stats(self, gen: GenerationStats) -> dict:
        out = self.stats()
        out.update(gen.as_dict())
        return out

    def placement(self) -> dict:
        """What the engine placed where, in bytes: weights, expert slots and stream buffers, KV, states,
        workspaces on the compute device; the expert bank in host RAM."""
        out = dict(self._placed)
        cache = self.model.cache
        if cache is not None:
            out["expert_slots"] = cache.rows.numel() * cache.rows.element_size()
            out["prefill_stream_buffers"] = cache.stream_buffer_bytes  # 0: they borrow slots during a prefill
        itemsize = torch.finfo(self.model.dtype).bits // 8
        sizes = ModelFacts.from_config(self.config, kv_dtype_bytes=itemsize, conv_dtype_bytes=itemsize)
        out["kv_cache_at_limit"] = self.max_context * sizes.kv_bytes_per_token
        out["recurrent_state"] = sizes.state_bytes
        workspace = getattr(self.model.kernels.attention, "workspace_bytes", 0)
        if workspace:
            out["attention_workspace"] = workspace
        if self.runner.decode_graph_bytes:  # measured at capture: what each overlap split's graph costs
            out["decode_graph"] = self.runner.decode_graph_bytes
        out["device_total"] = sum(v for k, v in out.items() if k not in ("host_expert_bank", "quantized_linears"))
        if self.options.vram_budget is not None:
            out["vram_budget"] = self.options.vram_budget
        return out

    def stats(self) -> dict:
        """Counters of the engine and of the last turn (hits/misses/H2D appear once experts are offloaded)."""
        out = {"device": self.device.type, "context_limit": self.max_context, **self._totals,
               "placement": self.placement()}
        if self._last is not None:
            out["last"] = self._last.as_dict()
        out.update(self.runner.counters)
        if self.model.cache is not None:
            out.update(self.model.cache.counters())
        pairs = getattr(self.model.kernels.attention, "pairs", None)
        if pairs is not None:  # FlashInfer: chunk pairs attended in one call, and pairs kept apart
            out.update(pairs.counters())
        if self.device.type == "cuda":
            out["vram_allocated"] = torch.cuda.memory_allocated(self.device)
        return out

    def _exclusive(self):
        if not self._busy.acquire(blocking=False):
            raise QwenlocalError("the engine is busy with another request; wait for it to finish")
        return _Release(self._busy)


class _NoSplit:
    """A raw completion has no thinking part: every piece is content."""

    def __init__(self, tokenizer: ChatTokenizer):
        self._decoder = StreamDecoder(tokenizer, skip_special_tokens=True)

    def push(self, token_id: int) -> list[tuple[str, str]]:
        piece = self._decoder.push(token_id)
        return [("content", piece)] if piece else []

    def flush(self) -> list[tuple[str, str]]:
        piece = self._decoder.flush()
        return [("content", piece)] if piece else []


class _Release:
    def __init__(self, lock: threading.Lock):
        self._lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._lock.release()
        return False
