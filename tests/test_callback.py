"""RepcapCallback in a Hugging Face Trainer: the monitor's values in the logs every reporter sees and in
state.log_history, at the right optimizer steps (gradient accumulation, compiled models), on the main
process only; and training bit-identical with and without it."""

import json

import pytest
import torch

import repcap_fast as rf

transformers = pytest.importorskip("transformers")
from repcap_fast.integrations import transformers as integration  # noqa: E402
from repcap_fast.integrations.transformers import RepcapCallback  # noqa: E402


def gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
                                  eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


DATA = torch.randint(0, 100, (64, 32), generator=torch.Generator().manual_seed(0))


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return len(DATA)

    def __getitem__(self, i):
        return {"input_ids": DATA[i], "labels": DATA[i]}


class Recorder(transformers.TrainerCallback):
    """Stands in for a reporter (report_to=): what its on_log receives."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append((state.global_step, dict(logs)))


def train(tmp_path, callbacks, steps=10, model=None, **kwargs):
    model = model or gpt2()
    args = transformers.TrainingArguments(str(tmp_path / "run"), max_steps=steps, per_device_train_batch_size=4,
                                          logging_steps=4, report_to=[], disable_tqdm=True, use_cpu=True,
                                          save_strategy="no", seed=3, **kwargs)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train()
    return trainer


def monitor(model, **kwargs):
    return rf.RepresentationMonitor(model, DATA[:8], n_tokens=64, k=8, n_null=5, **kwargs)


def test_the_values_reach_the_reporters_and_the_log_history_at_the_optimizer_steps(tmp_path):
    model = gpt2()
    recorder = Recorder()  # before the callback, as the Trainer puts the report_to= reporters
    out = tmp_path / "m.jsonl"
    trainer = train(tmp_path, [recorder, RepcapCallback(monitor(model, output=out), every_n_steps=3)], model=model,
                    gradient_accumulation_steps=2)
    measured = [h["step"] for h in trainer.state.log_history if "eps/input" in h]
    assert measured == [0, 3, 6, 9, 10]  # at start, every 3 optimizer steps, and the last
    assert [s for s, logs in recorder.logs if "pga_z/ccr1/layer2" in logs] == measured
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines] == measured
    history = {h["step"]: h for h in trainer.state.log_history if "eps/input" in h}
    assert history[6]["eps/input"] == lines[2]["eps/input"] and "epoch" in history[6]
    assert any("loss" in h for h in trainer.state.log_history)  # the Trainer's own logs are untouched


def test_the_final_values_equal_a_standalone_measurement_of_the_trained_model(tmp_path):
    model = gpt2()
    trainer = train(tmp_path, [RepcapCallback(monitor(model), every_n_steps=4)], model=model, steps=6)
    last = [h for h in trainer.state.log_history if "eps/input" in h][-1]
    again = monitor(model).measure(6)
    assert last["step"] == 6
    assert {k: last[k] for k in again if k.startswith(("eps", "pga"))} == {
        k: v for k, v in again.items() if k.startswith(("eps", "pga"))}


def _losses(trainer):
    return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]


def test_training_is_bit_identical_with_and_without_the_callback(tmp_path):
    plain = train(tmp_path, [], steps=20, model=gpt2(seed=1))
    model = gpt2(seed=1)
    watched = train(tmp_path, [RepcapCallback(monitor(model, measures=("epsilon", "pga", "spectral")),
                                              every_n_steps=4)], steps=20, model=model)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), watched.model.named_parameters()):
        assert torch.equal(a, b), name
    # the Trainer's own logs too, also at the steps measured (4, 8, ...: logging_steps is 4)
    assert _losses(watched) == _losses(plain) and [s for s, _ in _losses(plain)] == [4, 8, 12, 16, 20]


def test_a_compiled_model_is_measured_eagerly(tmp_path):
    model = gpt2()
    trainer = train(tmp_path, [RepcapCallback(monitor(model), every_n_steps=2)], model=model, steps=4,
                    torch_compile=True, torch_compile_backend="eager")
    assert [h["step"] for h in trainer.state.log_history if "eps/input" in h] == [0, 2, 4]


def test_without_the_handler_the_values_still_reach_the_log_history(tmp_path, monkeypatch):
    monkeypatch.setattr(integration, "_calling_handler", lambda: None)
    model = gpt2()
    recorder_after = Recorder()
    with pytest.warns(RuntimeWarning, match="could not find the Trainer's callback handler"):
        trainer = train(tmp_path, [RepcapCallback(monitor(model), every_n_steps=3, at_start=False), recorder_after],
                        model=model, steps=6)
    measured = [h["step"] for h in trainer.state.log_history if "eps/input" in h]
    assert measured == [3, 6]
    assert [s for s, logs in recorder_after.logs if "eps/input" in logs] == [3, 6]


def test_only_the_main_process_measures():
    calls = []
    callback = RepcapCallback(monitor(gpt2()), every_n_steps=1)
    callback.monitor.measure = lambda step: calls.append(step) or {"step": step}
    state = transformers.TrainerState(global_step=5, max_steps=10, is_world_process_zero=False)
    control = transformers.TrainerControl()
    callback.on_step_end(None, state, control)
    callback.on_train_end(None, state, control)
    assert calls == []
    state.is_world_process_zero = True
    with pytest.warns(RuntimeWarning, match="could not find the Trainer's callback handler"):  # called by hand
        callback.on_step_end(None, state, control)
    assert calls == [5]


@pytest.mark.parametrize("every, match", [(0, "every_n_steps must be >= 1"), (-5, "every_n_steps must be >= 1"),
                                          (2.5, "every_n_steps must be an integer")])
def test_bad_every_n_steps_fails_when_the_callback_is_built(every, match):
    with pytest.raises((ValueError, TypeError), match=match):
        RepcapCallback(monitor(gpt2()), every_n_steps=every)


def test_the_callback_needs_a_monitor():
    with pytest.raises(TypeError, match="monitor must be a repcap_fast.RepresentationMonitor"):
        RepcapCallback(gpt2(), every_n_steps=5)
