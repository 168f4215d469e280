#!/usr/bin/env python3
"""KempnerForge training entry point.

Usage:
    # Single GPU
    uv run python scripts/train.py configs/train/debug.toml

    # Multi-GPU (single node, via torchrun)
    uv run torchrun --nproc_per_node=4 scripts/train.py configs/train/7b.toml

    # Multi-node (via SLURM srun — see scripts/slurm/multinode.sh)
    # srun launches one process per GPU; MASTER_ADDR/MASTER_PORT are resolved
    # automatically from SLURM env vars by init_distributed().
    srun uv run python scripts/train.py configs/train/7b.toml

    # With overrides
    uv run python scripts/train.py configs/train/7b.toml \
        --train.max_steps=1000 --optimizer.lr=1e-4
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from kempnerforge.checkpoint.manager import CheckpointManager
from kempnerforge.config.loader import load_config
from kempnerforge.config.vlm import MoTConfig
from kempnerforge.data.dataloader import StatefulDataLoader
from kempnerforge.data.dataset import MemoryMappedDataset
from kempnerforge.data.sampler import DistributedSampler
from kempnerforge.distributed.parallel import (
    apply_ac,
    apply_float8,
    apply_fsdp2,
    build_parallel_model,
    default_mp_policy,
)
from kempnerforge.distributed.setup import destroy_distributed, get_world_info, init_distributed
from kempnerforge.distributed.tensor_parallel import apply_tensor_parallel
from kempnerforge.distributed.utils import clip_grad_norm_, get_dp_info
from kempnerforge.metrics.logger import get_logger
from kempnerforge.metrics.tracker import MetricsTracker
from kempnerforge.model.mot import mot_warm_start_from_text_stack
from kempnerforge.model.vlm import inner_transformer
from kempnerforge.profiling.profiler import build_profiler, print_profiler_summary
from kempnerforge.resilience.elastic import log_job_info, resolve_resume_path
from kempnerforge.resilience.health import NaNDetector, check_nccl_health
from kempnerforge.resilience.signal_handler import ShutdownHandler
from kempnerforge.training import (
    build_loss_fn,
    build_optimizer,
    build_scheduler,
    maybe_no_sync,
    run_eval,
)
from kempnerforge.training.freeze import (
    apply_freeze_specs,
    canonical_freeze_meta,
    effective_freeze,
)
from kempnerforge.training.hooks import HookRunner, StepContext

logger = get_logger(__name__)


def main() -> None:
    # --- Config ---
    if len(sys.argv) < 2:
        print("Usage: train.py <config.toml> [--section.key=value ...]")
        sys.exit(1)

    config_path = sys.argv[1]
    cli_args = sys.argv[2:]
    config = load_config(config_path, cli_args=cli_args)

    # --- Distributed setup ---
    rank, local_rank, world_size = get_world_info()
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")

    device_mesh = init_distributed(config.distributed, seed=config.train.seed)
    config.validate(world_size)

    log_job_info()
    logger.info(f"Training config: {config}")

    # --- Resilience ---
    shutdown_handler = ShutdownHandler(timeout_sec=config.train.shutdown_timeout_sec)
    shutdown_handler.register()

    nan_detector = NaNDetector(action="warn", max_consecutive=10)

    tc = config.train
    mc = config.model
    vlm_cfg = config.vlm
    vision_cfg = config.vision_encoder
    adapter_cfg = config.adapter
    is_vlm = config.is_vlm
    pp_enabled = config.distributed.pp > 1
    mp_policy = default_mp_policy(tc.param_dtype)

    # --- Loss function ---
    loss_fn = build_loss_fn(tc)

    # --- Model ---
    if pp_enabled:
        from kempnerforge.distributed.pipeline_parallel import (
            build_pipeline_schedule,
            build_pipeline_stage,
            build_stage_module,
            get_pp_rank,
            get_pp_size,
        )

        pp_rank = get_pp_rank(device_mesh)
        pp_size = get_pp_size(device_mesh)

        tp_enabled_pp = device_mesh is not None and "tp" in device_mesh.mesh_dim_names

        if tp_enabled_pp:
            # Meta-device init: same pattern as non-PP TP path.
            # Avoids OOM for large PP stages that don't fit on one GPU before TP shards them.
            with torch.device("meta"):
                stage_mod = build_stage_module(config.model, pp_rank, pp_size)
            model = stage_mod
            apply_tensor_parallel(model, device_mesh)
            if tc.is_fp8:
                apply_float8(model)
            apply_ac(model, tc.activation_checkpointing)
            if device_mesh is not None:
                apply_fsdp2(model, device_mesh, mp_policy=mp_policy)
            model.to_empty(device=device)
            model.init_weights_and_freqs()
            model.to(dtype=tc.param_dtype)
        else:
            stage_mod = build_stage_module(config.model, pp_rank, pp_size)
            model = stage_mod.to(device=device, dtype=tc.param_dtype)
            if tc.is_fp8:
                apply_float8(model)
            apply_ac(model, tc.activation_checkpointing)
            if device_mesh is not None:
                apply_fsdp2(model, device_mesh, mp_policy=mp_policy)

        if tc.compile_model:
            logger.info("Compiling model with torch.compile...")
            model = torch.compile(model)

        n_params = sum(p.numel() for p in model.parameters())
        logger.info(f"Model (PP stage {pp_rank}/{pp_size}): {n_params:,} parameters")

        # Build pipeline stage and schedule
        pp_stage = build_pipeline_stage(
            model,
            device_mesh,
            device,
            batch_size=tc.batch_size,
            seq_len=tc.seq_len,
            param_dtype=tc.param_dtype,
        )

        pp_schedule = build_pipeline_schedule(
            stage=pp_stage,
            n_microbatches=tc.grad_accum_steps,
            loss_fn=loss_fn,
            schedule=config.distributed.pp_schedule.value,
        )
    else:
        model = build_parallel_model(
            config.model,
            device,
            device_mesh,
            vision_config=vision_cfg,
            adapter_config=adapter_cfg,
            vlm_config=vlm_cfg,
            frames_per_clip=(config.video.max_frames if config.video is not None else 1),
            ac_mode=tc.activation_checkpointing,
            mp_policy=mp_policy,
            param_dtype=tc.param_dtype,
            compile_model=tc.compile_model,
            fp8=tc.is_fp8,
        )

    # --- Optimizer + Scheduler ---
    optimizer = build_optimizer(model, config.optimizer)
    scheduler = build_scheduler(optimizer, config.scheduler, max_steps=tc.max_steps)

    # --- Checkpoint ---
    # With PP, each stage has different parameters — DCP needs a group scoped
    # to ranks within the same PP stage (all non-PP mesh dimensions), and each
    # stage saves DCP shards to its own subdirectory to avoid file collisions.
    ckpt_pg = None
    ckpt_pp_rank = None
    if pp_enabled and device_mesh is not None:
        ckpt_pp_rank = pp_rank
        non_pp_dims = [d for d in device_mesh.mesh_dim_names if d != "pp"]
        if len(non_pp_dims) == 1:
            ckpt_pg = device_mesh[non_pp_dims[0]].get_group()
        elif len(non_pp_dims) > 1:
            ckpt_pg = device_mesh[tuple(non_pp_dims)].get_group()
    ckpt_mgr = CheckpointManager(
        config.checkpoint,
        model,
        optimizer,
        process_group=ckpt_pg,
        pp_rank=ckpt_pp_rank,
    )

    # Auto-resume
    resume_path = resolve_resume_path(config.checkpoint.dir)
    step, tokens_seen = 0, 0
    if resume_path or config.checkpoint.load_path:
        # On resume the expected freeze metadata reflects the
        # post-transition state at the saved step (effective_freeze
        # handles step-boundary transitions). Peek at the saved step
        # via metadata.json before invoking load() so the comparison
        # uses the same step the checkpoint was written at.
        vlm_freeze_expected = None
        if is_vlm:
            assert vlm_cfg is not None
            probe_step = ckpt_mgr.peek_saved_step(str(resume_path) if resume_path else None) or 0
            # valid_modules: the set of aliases the current config knows
            # about. effective_freeze raises ValueError if any FreezeSpec
            # references an alias not in this set, catching TOML typos at
            # config-load time rather than silently no-op'ing the freeze.
            valid_modules = set(vlm_cfg.module_patterns.keys())
            vlm_freeze_expected = canonical_freeze_meta(
                effective_freeze(probe_step, vlm_cfg.freeze, vlm_cfg.freeze_schedule, valid_modules)
            )
        step, tokens_seen, ckpt_extra_loaded = ckpt_mgr.load(
            path=str(resume_path) if resume_path else None,
            scheduler=scheduler,
            vlm_freeze_expected=vlm_freeze_expected,
        )
        if ckpt_extra_loaded.get("wandb_run_id"):
            config.metrics.wandb_run_id = ckpt_extra_loaded["wandb_run_id"]
        # MoT warm-start: translate dense TransformerBlock weights from a
        # JD/text-only checkpoint into per-modality copies inside every
        # MoTBlock. Runs once at the start of training (resume_path is
        # None or step == 0); a real resume of an in-flight MoT run
        # already has the MoT-shaped state in the checkpoint and skips
        # this hook.
        if isinstance(vlm_cfg, MoTConfig) and vlm_cfg.mot_warm_start_from_text and step == 0:
            source = torch.load(vlm_cfg.mot_warm_start_path, map_location="cpu", weights_only=True)
            if isinstance(source, dict) and "model" in source:
                source = source["model"]
            mot_warm_start_from_text_stack(inner_transformer(model), source)  # type: ignore[arg-type]
            logger.info(
                f"MoT warm-start: copied dense block weights from {vlm_cfg.mot_warm_start_path}"
            )
        # Apply effective freeze at the resumed step so requires_grad
        # reflects the post-transition state of any stages with
        # start_step <= loaded_step. Build-time apply only handles
        # the base freeze list.
        if vlm_cfg is not None and vlm_cfg.freeze_schedule:
            valid_modules = set(vlm_cfg.module_patterns.keys())
            specs = effective_freeze(step, vlm_cfg.freeze, vlm_cfg.freeze_schedule, valid_modules)
            apply_freeze_specs(model, specs, vlm_cfg.module_patterns)
            logger.info(f"Resumed at step={step}; applied effective freeze ({len(specs)} specs)")

    # --- Metrics ---
    tracker = MetricsTracker(config, num_gpus=world_size)
    tracker.init_backends(config)

    # --- Profiler ---
    prof = build_profiler(config.profiling, rank=rank)

    # --- Data ---
    # With PP, sampler should use DP rank/size (not total world size) since
    # all PP stages in the same DP group process the same batch.
    dp_rank, dp_size = get_dp_info(device_mesh)

    dataset = None
    dataloader = None
    data_iter = None
    mixture_dataset = None  # Set when multi-dataset mixing is active

    # Resolve EOS token ID for sequence packing (needed by MemoryMappedDataset)
    eos_token_id = None
    if config.data.pack_sequences:
        has_mmap = bool(config.data.dataset_path) or any(s.path for s in config.data.datasets)
        if has_mmap:
            if not config.data.tokenizer_path:
                raise ValueError("data.tokenizer_path is required when pack_sequences=True")
            from transformers import AutoTokenizer as _AT

            eos_token_id = _AT.from_pretrained(config.data.tokenizer_path).eos_token_id

    if is_vlm:
        assert vlm_cfg is not None  # narrowed by is_vlm
        if config.is_video:
            # --- Video data path (a clip = ordered frames; same VLM wrapper) ---
            assert config.video is not None  # narrowed by is_video
            if not config.data.tokenizer_path:
                raise ValueError("Video training requires data.tokenizer_path")
            from transformers import AutoTokenizer

            from kempnerforge.data.video_dataset import VideoCollator, build_video_dataset

            vcfg = config.video
            # Dataset style is registry-selected via [video].dataset_type; the
            # builder reads the rest of the knobs off vcfg.
            dataset = build_video_dataset(vcfg, config.data.tokenizer_path, vlm_cfg.max_text_len)
            _tok = AutoTokenizer.from_pretrained(config.data.tokenizer_path)
            _pad_id = _tok.pad_token_id
            if _pad_id is None:
                _pad_id = _tok.eos_token_id if _tok.eos_token_id is not None else 0
            collator = VideoCollator(pad_id=int(_pad_id), max_text_len=vlm_cfg.max_text_len)
            logger.info(f"Video dataset: {len(dataset):,} clips from {vcfg.data_root}")
        else:
            # --- Image VLM (Joint-Decoder) data path ---
            # Mixing VLM + text-only datasets in one run is out of scope on this
            # branch. DatasetSource doesn't describe image sources yet; follow-up.
            if not config.data.hf_dataset_name or not config.data.tokenizer_path:
                raise ValueError(
                    "VLM training requires data.hf_dataset_name and data.tokenizer_path"
                )
            from transformers import AutoTokenizer

            from kempnerforge.data.vlm_dataset import HuggingFaceVLMDataset, VLMCollator

            dataset = HuggingFaceVLMDataset(
                dataset_name=config.data.hf_dataset_name,
                split=config.data.hf_dataset_split,
                image_field=config.data.hf_dataset_image_field,
                text_field=config.data.hf_dataset_text_field,
                tokenizer_path=config.data.tokenizer_path,
                max_text_len=vlm_cfg.max_text_len,
                prompt_field=config.data.hf_dataset_prompt_field or None,
                image_size=config.data.hf_image_size,
                dataset_config=config.data.hf_dataset_config,
            )
            # Resolve pad_id from the tokenizer for VLMCollator. Fall back to
            # EOS when pad_token_id is unset (gpt2, some Llama families), then
            # to 0 as a last resort. Collator also enforces fixed-length
            # padding so all DP ranks see identical tensor shapes and emits
            # the image_positions slot (D18) for downstream multi-image work.
            _tok = AutoTokenizer.from_pretrained(config.data.tokenizer_path)
            _pad_id = _tok.pad_token_id
            if _pad_id is None:
                _pad_id = _tok.eos_token_id if _tok.eos_token_id is not None else 0
            collator = VLMCollator(pad_id=int(_pad_id), max_text_len=vlm_cfg.max_text_len)
            logger.info(f"VLM dataset: {len(dataset):,} samples from {config.data.hf_dataset_name}")
        sampler = DistributedSampler(
            dataset, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=tc.effective_data_seed
        )
        dataloader = StatefulDataLoader(
            dataset,
            batch_size=tc.batch_size,
            sampler=sampler,
            config=config.data,
            collate_fn=collator,
        )

    elif config.data.datasets:
        # --- Multi-dataset mixing ---
        from kempnerforge.data.dataset import HuggingFaceDataset, MixtureDataset
        from kempnerforge.data.sampler import MixtureSampler

        sub_datasets = []
        names = []
        weights = []
        for src in config.data.datasets:
            if src.path:
                ds = MemoryMappedDataset(
                    data_dir=src.path,
                    seq_len=tc.seq_len + 1,
                    file_pattern=config.data.file_pattern,
                    pack_sequences=config.data.pack_sequences,
                    eos_token_id=eos_token_id,
                )
            elif src.hf_name:
                if not config.data.tokenizer_path:
                    raise ValueError(f"data.tokenizer_path required for HF dataset '{src.hf_name}'")
                ds = HuggingFaceDataset(
                    dataset_name=src.hf_name,
                    split=config.data.hf_dataset_split,
                    text_field=config.data.hf_dataset_text_field,
                    seq_len=tc.seq_len,
                    tokenizer_path=config.data.tokenizer_path,
                    dataset_config=src.hf_config or None,
                    pack_sequences=config.data.pack_sequences,
                )
            else:
                continue
            sub_datasets.append(ds)
            names.append(src.name or src.path or src.hf_name)
            weights.append(src.weight)

        mixture_dataset = MixtureDataset(sub_datasets, names)
        dataset = mixture_dataset
        sampler = MixtureSampler(
            cumulative_sizes=mixture_dataset.cumulative_sizes,
            weights=weights,
            num_replicas=dp_size,
            rank=dp_rank,
            shuffle=True,
            seed=tc.effective_data_seed,
            temperature=config.data.mix_temperature,
        )
        dataloader = StatefulDataLoader(
            dataset,
            batch_size=tc.batch_size,
            sampler=sampler,
            config=config.data,
        )
        logger.info(
            f"Dataset: mixture of {len(sub_datasets)} sources, "
            f"{len(mixture_dataset):,} total samples"
        )

    elif config.data.dataset_path:
        # Pre-tokenized data on disk (fastest path)
        dataset = MemoryMappedDataset(
            data_dir=config.data.dataset_path,
            seq_len=tc.seq_len + 1,
            file_pattern=config.data.file_pattern,
            pack_sequences=config.data.pack_sequences,
            eos_token_id=eos_token_id,
        )
        sampler = DistributedSampler(
            dataset,
            num_replicas=dp_size,
            rank=dp_rank,
            shuffle=True,
            seed=tc.effective_data_seed,
        )
        dataloader = StatefulDataLoader(
            dataset,
            batch_size=tc.batch_size,
            sampler=sampler,
            config=config.data,
        )
        logger.info(f"Dataset: {len(dataset):,} samples from {config.data.dataset_path}")
    elif config.data.hf_dataset_name:
        if not config.data.tokenizer_path:
            raise ValueError("data.tokenizer_path is required for HuggingFace datasets")

        if config.data.hf_streaming:
            # Streaming: on-the-fly tokenization, no full download needed
            from torch.utils.data import DataLoader as TorchDataLoader

            from kempnerforge.data.dataset import StreamingHuggingFaceDataset

            dataset = StreamingHuggingFaceDataset(
                dataset_name=config.data.hf_dataset_name,
                split=config.data.hf_dataset_split,
                text_field=config.data.hf_dataset_text_field,
                seq_len=tc.seq_len,
                tokenizer_path=config.data.tokenizer_path,
                dataset_config=config.data.hf_dataset_config,
                rank=dp_rank,
                world_size=dp_size,
                seed=tc.effective_data_seed,
                pack_sequences=config.data.pack_sequences,
            )
            dataloader = TorchDataLoader(
                dataset,
                batch_size=tc.batch_size,
                num_workers=config.data.num_workers,
                pin_memory=config.data.pin_memory,
                prefetch_factor=(
                    config.data.prefetch_factor if config.data.num_workers > 0 else None
                ),
            )
            logger.info(
                f"Dataset: streaming from {config.data.hf_dataset_name} "
                f"({config.data.hf_dataset_split}), rank={dp_rank}/{dp_size}"
            )
        else:
            # Eager: download, tokenize, and pack all sequences into memory
            from kempnerforge.data.dataset import HuggingFaceDataset

            dataset = HuggingFaceDataset(
                dataset_name=config.data.hf_dataset_name,
                split=config.data.hf_dataset_split,
                text_field=config.data.hf_dataset_text_field,
                seq_len=tc.seq_len,
                tokenizer_path=config.data.tokenizer_path,
                dataset_config=config.data.hf_dataset_config,
                pack_sequences=config.data.pack_sequences,
            )
            sampler = DistributedSampler(
                dataset,
                num_replicas=dp_size,
                rank=dp_rank,
                shuffle=True,
                seed=tc.effective_data_seed,
            )
            dataloader = StatefulDataLoader(
                dataset,
                batch_size=tc.batch_size,
                sampler=sampler,
                config=config.data,
            )
            logger.info(
                f"Dataset: {len(dataset):,} packed sequences from "
                f"{config.data.hf_dataset_name} ({config.data.hf_dataset_split})"
            )

    # Apply any dataloader state stashed during load(). Runs after dataloader
    # construction because the loader's identity depends on phase scheduling
    # that load() restores. No-op when resuming without a prior dataloader
    # state or when the loader is not stateful (plain TorchDataLoader).
    if dataloader is not None:
        ckpt_mgr.apply_dataloader_state(dataloader)

    # --- Eval data ---
    # VLM + eval is out of scope on this branch: run_eval calls
    # `model(input_ids)`, which does not match VLMWrapper's
    # `forward(pixel_values, input_ids, labels)`. The helper decides
    # whether to build the eval dataloader and whether to log a clear
    # warning that eval was skipped for VLM configs.
    from kempnerforge.training.eval import should_build_eval_dataloader

    eval_config = config.eval
    eval_dataloader = None
    _build_eval, _warn_vlm_eval = should_build_eval_dataloader(eval_config.enabled, is_vlm)
    if _warn_vlm_eval:
        logger.warning(
            "eval.enabled=true is ignored for VLM configs on this branch. "
            "run_eval does not support VLMWrapper.forward yet; disabling "
            "eval for the duration of this run."
        )
    if _build_eval:
        from torch.utils.data import DataLoader as TorchDataLoader

        if eval_config.dataset_path:
            eval_dataset = MemoryMappedDataset(
                data_dir=eval_config.dataset_path,
                seq_len=tc.seq_len + 1,
                file_pattern=eval_config.file_pattern,
            )
            eval_sampler = DistributedSampler(
                eval_dataset, num_replicas=dp_size, rank=dp_rank, shuffle=False, seed=tc.seed
            )
            eval_dataloader = TorchDataLoader(
                eval_dataset, batch_size=tc.batch_size, sampler=eval_sampler
            )
            logger.info(
                f"Eval dataset: {len(eval_dataset):,} samples from {eval_config.dataset_path}"
            )
        elif eval_config.hf_dataset_name:
            import numpy as np

            from kempnerforge.data.dataset import HuggingFaceDataset

            # Rank 0 loads/tokenizes the HF eval dataset, then broadcasts the
            # packed token tensor to all ranks via torch.distributed.broadcast.
            # This avoids file-lock failures (flock) on cluster filesystems
            # (Lustre, VAST) where load_dataset() would crash on all ranks.
            if rank == 0:
                eval_ds = HuggingFaceDataset(
                    dataset_name=eval_config.hf_dataset_name,
                    split=eval_config.hf_dataset_split,
                    text_field=config.data.hf_dataset_text_field,
                    seq_len=tc.seq_len,
                    tokenizer_path=config.data.tokenizer_path,
                    dataset_config=eval_config.hf_dataset_config,
                )
                packed = torch.from_numpy(np.stack(eval_ds._packed_sequences))
                n_seqs = torch.tensor([packed.shape[0]], device=device)
            else:
                n_seqs = torch.tensor([0], device=device)

            dist.broadcast(n_seqs, src=0)
            if rank != 0:
                packed = torch.empty(n_seqs.item(), tc.seq_len + 1, dtype=torch.long)
            packed_gpu = packed.to(device)
            dist.broadcast(packed_gpu, src=0)
            packed = packed_gpu.cpu()
            del packed_gpu

            # Wrap broadcast data as a simple map-style dataset
            class _EvalTensorDataset(torch.utils.data.Dataset):
                def __init__(self, data: torch.Tensor) -> None:
                    self._data = data

                def __len__(self) -> int:
                    return self._data.shape[0]

                def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
                    tokens = self._data[idx]
                    return {"input_ids": tokens[:-1], "labels": tokens[1:]}

            eval_dataset = _EvalTensorDataset(packed)
            eval_sampler = DistributedSampler(
                eval_dataset, num_replicas=dp_size, rank=dp_rank, shuffle=False, seed=tc.seed
            )
            eval_dataloader = TorchDataLoader(
                eval_dataset, batch_size=tc.batch_size, sampler=eval_sampler
            )
            logger.info(
                f"Eval dataset: {len(eval_dataset):,} packed sequences from "
                f"{eval_config.hf_dataset_name} ({eval_config.hf_dataset_split})"
            )

    # --- Phase scheduling (data annealing) ---
    active_phases: list = []
    if config.data.phases:
        active_phases = sorted(config.data.phases, key=lambda p: p.start_step)
    elif config.data.anneal_start_step > 0 and config.data.anneal_weights:
        from kempnerforge.config.schema import TrainingPhase

        active_phases = [
            TrainingPhase(
                start_step=config.data.anneal_start_step,
                dataset_weights=dict(config.data.anneal_weights),
            )
        ]

    # Track original weights (by dataset name) for fallback when a phase
    # doesn't override every dataset's weight.
    original_weights_dict: dict[str, float] = {}
    if mixture_dataset is not None:
        for i, name in enumerate(mixture_dataset.dataset_names):
            original_weights_dict[name] = weights[i]

    current_phase_idx = 0  # Index of next phase to activate
    phase_lr_scale = 1.0

    # On resume, re-derive phase state from current step
    if step > 0 and active_phases and mixture_dataset is not None:
        for i, phase in enumerate(active_phases):
            if step >= phase.start_step:
                new_weights = [
                    phase.dataset_weights.get(name, original_weights_dict[name])
                    for name in mixture_dataset.dataset_names
                ]
                sampler.update_weights(new_weights, temperature=config.data.mix_temperature)
                phase_lr_scale = phase.lr_scale
                current_phase_idx = i + 1
        if current_phase_idx > 0:
            logger.info(f"Resumed into phase {current_phase_idx - 1}, lr_scale={phase_lr_scale}")

    logger.info(
        f"Starting training: step={step}, max_steps={tc.max_steps}, "
        f"batch_size={tc.batch_size}, grad_accum={tc.grad_accum_steps}, "
        f"world_size={world_size}"
    )
    if active_phases:
        logger.info(f"Phase scheduling: {len(active_phases)} phase(s) configured")

    model.train()
    hook_runner = HookRunner()
    hook_runner.on_train_begin(config)

    if prof is not None:
        prof.start()

    # Capture the initial weights (step 0) on fresh start when the
    # dyn_ckpt_window covers step 0 -- the per-step save gate only runs
    # after a training step completes, so without this the random init
    # is never persisted. Skipped on resume (step > 0).
    if step == 0 and config.checkpoint.is_dynamic_milestone(0):
        init_extra: dict = {"phase_idx": current_phase_idx} if active_phases else {}
        if config.metrics.wandb_run_id:
            init_extra["wandb_run_id"] = config.metrics.wandb_run_id
        if is_vlm:
            assert vlm_cfg is not None
            valid_modules = set(vlm_cfg.module_patterns.keys())
            init_extra["vlm_freeze"] = canonical_freeze_meta(
                effective_freeze(0, vlm_cfg.freeze, vlm_cfg.freeze_schedule, valid_modules)
            )
        ckpt_mgr.save(
            step=0,
            tokens_seen=0,
            scheduler=scheduler,
            dataloader=dataloader,
            extra=init_extra,
        )
        hook_runner.on_checkpoint_save(0, config.checkpoint.dir)

    completed_normally = False

    while step < tc.max_steps:
        # Refresh data iterator at start / epoch boundary
        if dataloader is not None and data_iter is None:
            data_iter = iter(dataloader)

        tracker.start_step()

        if pp_enabled:
            # --- PP training step ---
            # Collect microbatches into a full batch for the schedule.
            # schedule.step() splits along dim 0 into n_microbatches.
            input_ids_list, labels_list = [], []
            for _ in range(tc.grad_accum_steps):
                if dataloader is not None:
                    try:
                        batch = next(data_iter)
                    except StopIteration:
                        data_iter = iter(dataloader)
                        batch = next(data_iter)
                    input_ids_list.append(batch["input_ids"].to(device))
                    labels_list.append(batch["labels"].to(device))
                else:
                    input_ids_list.append(
                        torch.randint(0, mc.vocab_size, (tc.batch_size, tc.seq_len), device=device)
                    )
                    labels_list.append(
                        torch.randint(0, mc.vocab_size, (tc.batch_size, tc.seq_len), device=device)
                    )

            full_input = torch.cat(input_ids_list, dim=0)
            full_labels = torch.cat(labels_list, dim=0)

            # The schedule handles forward/backward for all microbatches.
            # First stage needs input; last stage needs target for loss.
            # schedule.step() returns model output; losses are collected via the
            # losses= output parameter (list populated by the schedule).
            is_first = pp_rank == 0
            is_last = pp_rank == pp_size - 1
            pp_losses: list[torch.Tensor] = []

            if is_first:
                pp_schedule.step(full_input, target=full_labels, losses=pp_losses)
            elif is_last:
                pp_schedule.step(target=full_labels, losses=pp_losses)
            else:
                pp_schedule.step()

            # Loss is only meaningful on the last stage
            if is_last and pp_losses:
                avg_loss = sum(loss.item() for loss in pp_losses) / len(pp_losses)
            else:
                avg_loss = 0.0

            # Gradient clipping
            grad_norm = clip_grad_norm_(model, tc.grad_clip_norm)
            grad_norm_val = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm

            # Broadcast loss and grad_norm from last PP stage to all PP stages
            pp_mesh = device_mesh["pp"]
            pp_group = pp_mesh.get_group()
            loss_tensor = torch.tensor([avg_loss, grad_norm_val], device=device)
            dist.broadcast(loss_tensor, group_src=pp_size - 1, group=pp_group)
            avg_loss = loss_tensor[0].item()
            grad_norm_val = loss_tensor[1].item()

        elif is_vlm:
            # --- VLM training step (no PP, VLM Joint-Decoder) ---
            total_loss = 0.0
            total_text_tokens = 0

            for micro_step in range(tc.grad_accum_steps):
                if dataloader is None:
                    raise RuntimeError(
                        "VLM training requires a real dataloader; synthetic fallback "
                        "(randint) does not produce pixel_values"
                    )
                try:
                    batch = next(data_iter)
                except StopIteration:
                    data_iter = iter(dataloader)
                    batch = next(data_iter)
                pixel_values = batch["pixel_values"].to(device)
                input_ids = batch["input_ids"].to(device)
                labels = batch["labels"].to(device)
                # Video batches carry a per-frame validity mask; image batches do not.
                frame_mask = batch["frame_mask"].to(device) if "frame_mask" in batch else None

                with maybe_no_sync(model, micro_step, tc.grad_accum_steps):
                    if mc.is_moe:
                        inner_transformer(model).set_moe_step(step, tc.max_steps)  # type: ignore[attr-defined]
                    logits, labels_out = model(
                        pixel_values, input_ids, labels, frame_mask=frame_mask
                    )
                    loss = loss_fn(logits, labels_out)

                    total_text_tokens += int((labels_out != -100).sum().item())

                    # MoE auxiliary loss (no-op for dense: returns 0.0)
                    if mc.is_moe:
                        aux_loss = inner_transformer(model).get_moe_aux_loss()  # type: ignore[attr-defined]
                        loss = loss + mc.moe_aux_loss_weight * aux_loss
                        if mc.moe_router_z_loss_weight > 0:
                            z = inner_transformer(model).get_moe_router_z_loss()  # type: ignore[attr-defined]
                            loss = loss + mc.moe_router_z_loss_weight * z

                    scaled_loss = loss / tc.grad_accum_steps
                    scaled_loss.backward()
                    total_loss += loss.item()

            avg_loss = total_loss / tc.grad_accum_steps
            grad_norm = clip_grad_norm_(model, tc.grad_clip_norm)
            grad_norm_val = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm

        else:
            # --- Standard training step (no PP, text-only) ---
            total_loss = 0.0
            ds_token_counts: dict[str, int] = {}
            ds_loss_sums: dict[str, float] = {}
            ds_loss_counts: dict[str, int] = {}

            for micro_step in range(tc.grad_accum_steps):
                if dataloader is not None:
                    try:
                        batch = next(data_iter)
                    except StopIteration:
                        data_iter = iter(dataloader)
                        batch = next(data_iter)
                    input_ids = batch["input_ids"].to(device)
                    labels = batch["labels"].to(device)
                    doc_ids = batch["doc_ids"].to(device) if "doc_ids" in batch else None
                else:
                    input_ids = torch.randint(
                        0, mc.vocab_size, (tc.batch_size, tc.seq_len), device=device
                    )
                    labels = torch.randint(
                        0, mc.vocab_size, (tc.batch_size, tc.seq_len), device=device
                    )
                    doc_ids = None

                with maybe_no_sync(model, micro_step, tc.grad_accum_steps):
                    if mc.is_moe:
                        inner_transformer(model).set_moe_step(step, tc.max_steps)  # type: ignore[attr-defined]
                    logits = model(input_ids, doc_ids=doc_ids)
                    loss = loss_fn(logits, labels)

                    # Per-dataset metrics (before backward, while logits are fresh)
                    if mixture_dataset is not None and "dataset_idx" in batch:
                        ds_idx = batch["dataset_idx"]
                        with torch.no_grad():
                            for i, name in enumerate(mixture_dataset.dataset_names):
                                mask = ds_idx == i
                                count = mask.sum().item()
                                if count > 0:
                                    ds_token_counts[name] = (
                                        ds_token_counts.get(name, 0) + count * tc.seq_len
                                    )
                                    ds_l = torch.nn.functional.cross_entropy(
                                        logits[mask].reshape(-1, logits.size(-1)),
                                        labels[mask].reshape(-1),
                                        ignore_index=-100,
                                    ).item()
                                    ds_loss_sums[name] = ds_loss_sums.get(name, 0) + ds_l
                                    ds_loss_counts[name] = ds_loss_counts.get(name, 0) + 1

                    # MoE auxiliary loss (no-op for dense: returns 0.0)
                    if mc.is_moe:
                        aux_loss = inner_transformer(model).get_moe_aux_loss()  # type: ignore[attr-defined]
                        loss = loss + mc.moe_aux_loss_weight * aux_loss
                        if mc.moe_router_z_loss_weight > 0:
                            z = inner_transformer(model).get_moe_router_z_loss()  # type: ignore[attr-defined]
                            loss = loss + mc.moe_router_z_loss_weight * z

                    scaled_loss = loss / tc.grad_accum_steps
                    scaled_loss.backward()
                    total_loss += loss.item()

            avg_loss = total_loss / tc.grad_accum_steps

            # Gradient clipping
            grad_norm = clip_grad_norm_(model, tc.grad_clip_norm)
            grad_norm_val = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm

        # NaN check
        if not nan_detector.check_loss(avg_loss, step):
            optimizer.zero_grad()
            if nan_detector.should_rollback:
                logger.error("Too many consecutive NaNs — stopping")
                break
            step += 1
            continue

        # Optimizer step
        optimizer.step()
        scheduler.step()

        # Phase LR scaling (applied after scheduler computes base LR)
        if phase_lr_scale != 1.0:
            for pg in optimizer.param_groups:
                pg["lr"] *= phase_lr_scale

        optimizer.zero_grad()

        step += 1
        tokens_in_step = tc.batch_size * tc.seq_len * tc.grad_accum_steps * dp_size
        tokens_seen += tokens_in_step

        # FreezeStage hook: apply any stage whose start_step matches the
        # current step boundary. AdamW + set_to_none=True default skips
        # frozen params entirely (no SGD step, no weight decay), so
        # mutating requires_grad mid-training is a clean no-op for
        # newly-frozen params and re-enables gradient flow for
        # newly-unfrozen ones.
        #
        # Async-save fence: drain any in-flight save FIRST so that its
        # metadata.json — which records the pre-transition spec — lands
        # before we flip requires_grad. Otherwise a save started at
        # step S-1 could write metadata after the transition, attaching
        # the post-transition spec to pre-transition shards.
        if is_vlm and vlm_cfg is not None and vlm_cfg.freeze_schedule:
            pending_stages = [s for s in vlm_cfg.freeze_schedule if s.start_step == step]
            if pending_stages:
                ckpt_mgr.flush_pending_save()
                for stage in pending_stages:
                    flipped = apply_freeze_specs(model, stage.specs, vlm_cfg.module_patterns)
                    logger.info(f"FreezeStage at step={step}: applied {flipped}")

        # Phase transition check
        if active_phases and mixture_dataset is not None:
            while (
                current_phase_idx < len(active_phases)
                and step >= active_phases[current_phase_idx].start_step
            ):
                phase = active_phases[current_phase_idx]
                new_weights = [
                    phase.dataset_weights.get(name, original_weights_dict[name])
                    for name in mixture_dataset.dataset_names
                ]
                sampler.update_weights(new_weights, temperature=config.data.mix_temperature)
                phase_lr_scale = phase.lr_scale
                logger.info(
                    f"Phase transition at step {step}: "
                    f"phase={current_phase_idx}, lr_scale={phase_lr_scale}"
                )
                current_phase_idx += 1
                # Force data iterator refresh so new weights take effect
                data_iter = None

        # Metrics (report LR after phase scaling)
        current_lr = optimizer.param_groups[0]["lr"]
        step_metrics = tracker.end_step(
            step=step,
            loss=avg_loss,
            grad_norm=grad_norm_val,
            lr=current_lr,
            tokens_in_step=tokens_in_step,
        )

        hook_runner.on_step_end(
            StepContext(
                step=step,
                loss=avg_loss,
                grad_norm=grad_norm_val,
                lr=current_lr,
                tokens_seen=tokens_seen,
                model=model,
                optimizer=optimizer,
            )
        )

        # MoE metrics (logged at same interval as main metrics)
        if mc.is_moe and step_metrics is not None:
            _inner = inner_transformer(model)
            moe_metrics = {"moe/aux_loss": _inner.get_moe_aux_loss().item()}  # type: ignore[attr-defined]
            moe_metrics["moe/router_z_loss"] = _inner.get_moe_router_z_loss().item()  # type: ignore[attr-defined]
            expert_counts = _inner.get_expert_counts()  # type: ignore[attr-defined]
            if expert_counts:
                all_counts = torch.stack(list(expert_counts.values())).float()
                moe_metrics["moe/expert_balance"] = (all_counts.min() / all_counts.max()).item()
            tracker.log_eval(moe_metrics, step)

        # VLM per-step text-token count (excludes image prefix, -100 pad, and
        # masked prompt tokens). Logged separately from tokens_in_step which
        # still reports sequence positions processed. The counter is DP-local
        # on each rank, so all-reduce it to the global text-token count
        # before logging.
        if is_vlm and step_metrics is not None:
            global_text_tokens = total_text_tokens
            if dist.is_initialized():
                _t = torch.tensor([total_text_tokens], device=device, dtype=torch.long)
                dist.all_reduce(_t, op=dist.ReduceOp.SUM)
                global_text_tokens = int(_t.item())
            tracker.log_eval({"data/text_tokens_trained": float(global_text_tokens)}, step)

        # Per-dataset metrics (logged at same interval as main metrics)
        if mixture_dataset is not None and step_metrics is not None and ds_loss_sums:
            ds_metrics: dict[str, float] = {}
            for name in ds_loss_sums:
                ds_metrics[f"loss/{name}"] = ds_loss_sums[name] / ds_loss_counts[name]
            for name, count in ds_token_counts.items():
                ds_metrics[f"data/{name}/tokens"] = float(count)
            tracker.log_eval(ds_metrics, step)

        # Periodic NCCL health check
        if (
            tc.nccl_health_check_interval > 0
            and step % tc.nccl_health_check_interval == 0
            and not check_nccl_health()
        ):
            logger.error(f"NCCL health check failed at step {step} — stopping")
            break

        # Eval
        if eval_config.enabled and eval_dataloader is not None and step % eval_config.interval == 0:
            pp_group = None
            if pp_enabled:
                pp_mesh = device_mesh["pp"]
                pp_group = pp_mesh.get_group()
            eval_metrics = run_eval(
                model,
                eval_dataloader,
                loss_fn,
                device,
                eval_config.steps,
                pp_schedule=pp_schedule if pp_enabled else None,
                pp_rank=pp_rank if pp_enabled else None,
                pp_size=pp_size if pp_enabled else None,
                pp_group=pp_group,
            )
            tracker.log_eval(eval_metrics, step)
            hook_runner.on_eval_end(eval_metrics, step)

        # Advance profiler schedule
        if prof is not None:
            prof.step()

        # Checkpoint (include phase index + wandb run ID for exact resumption)
        ckpt_extra: dict = {"phase_idx": current_phase_idx} if active_phases else {}
        if config.metrics.wandb_run_id:
            ckpt_extra["wandb_run_id"] = config.metrics.wandb_run_id
        if is_vlm:
            assert vlm_cfg is not None
            # Use effective_freeze so the saved metadata reflects the
            # post-transition state when a FreezeStage has fired.
            # valid_modules pins typo-catching at save time too.
            valid_modules = set(vlm_cfg.module_patterns.keys())
            ckpt_extra["vlm_freeze"] = canonical_freeze_meta(
                effective_freeze(step, vlm_cfg.freeze, vlm_cfg.freeze_schedule, valid_modules)
            )
        if config.checkpoint.should_save(step):
            ckpt_mgr.save(
                step=step,
                tokens_seen=tokens_seen,
                scheduler=scheduler,
                dataloader=dataloader,
                extra=ckpt_extra,
            )
            hook_runner.on_checkpoint_save(step, config.checkpoint.dir)

        # Graceful shutdown
        if shutdown_handler.should_shutdown():
            logger.warning(f"Shutdown requested at step {step} — saving emergency checkpoint")
            ckpt_mgr.save(
                step=step,
                tokens_seen=tokens_seen,
                scheduler=scheduler,
                dataloader=dataloader,
                extra=ckpt_extra,
            )
            shutdown_handler.finish()
            break

        # Clean-completion marker for the unconditional final save after the
        # loop. Only reached when training completes without any errors, e.g.,
        # no NaN/NCCL/shutdown breaks. If a run encounters a NaN, the last step
        # is intentionally *not* saved because the actual model state would be
        # `max_steps - 1`, not `max_steps`.
        if step >= tc.max_steps:
            completed_normally = True

    if prof is not None:
        prof.stop()
        if rank == 0:
            print_profiler_summary(prof, trace_dir=config.profiling.trace_dir)

    if completed_normally and not config.checkpoint.should_save(step):
        ckpt_mgr.save(
            step=step,
            tokens_seen=tokens_seen,
            scheduler=scheduler,
            dataloader=dataloader,
            extra=ckpt_extra,
        )
        hook_runner.on_checkpoint_save(step, config.checkpoint.dir)

    # Flush any pending async checkpoint before tearing down process group
    ckpt_mgr.wait()

    logger.info(f"Training complete: {step} steps, {tokens_seen:,} tokens")
    hook_runner.on_train_end(step, tokens_seen)
    tracker.close()
    destroy_distributed()


if __name__ == "__main__":
    main()
