"""The transformers backend on a tiny random-weight Phi-3 built offline: score mode, prefix reuse, LoRA,
int8/int4 through BitsAndBytesConfig, generate mode, and the backend behind the bridge."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bridge import STATUS_OK, BridgeConfig, PromptInstrument, PromptRenderer, SidecarClient  # noqa: E402
from llm_sidecar.__main__ import example_fields  # noqa: E402
from llm_sidecar.backends import TransformersBackend, TransformersOptions, quantization_config  # noqa: E402
from llm_sidecar.models import build_tiny_phi3  # noqa: E402

# prices written whole (no decimals): the random tiny model's greedy texts on these prompts are ragged, which
# test_scoring_after_generated_text_... needs
RENDERER = PromptRenderer.from_yaml(instrument=PromptInstrument(price_decimals=0))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(build_tiny_phi3(tmp_path_factory.mktemp("tiny_phi3")))


@pytest.fixture(scope="module")
def contexts():
    fields, texts = example_fields(12, seed=5)
    return [p.decode() for p in RENDERER.render(fields, texts)]


def backend(model, **options):
    return TransformersBackend(TransformersOptions(model=model, **options), RENDERER.system, RENDERER.answer_prefix)


def assert_distributions(answers, n):
    assert answers.probs.shape == (n, 6)
    assert np.isfinite(answers.probs).all() and (answers.probs >= 0).all()
    assert np.allclose(answers.probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(answers.confidence, answers.probs.max(axis=1))
    assert (answers.action == answers.probs.argmax(axis=1)).all()


def test_score_mode_gives_valid_distributions_independent_of_batching_and_prefix_reuse(tiny_model, contexts):
    shared = backend(tiny_model)
    answers = shared.advise(contexts)
    assert_distributions(answers, len(contexts))
    assert (answers.status == STATUS_OK).all() and answers.prompt_tokens > 0
    assert answers.probs.std(axis=0).max() > 1e-4  # depends on the prompt, even with random weights
    full = backend(tiny_model, prefix_cache=False).advise(contexts)
    assert np.allclose(answers.probs, full.probs, atol=1e-5)  # the shared-prefix KV cache changes nothing
    alone = np.concatenate([shared.advise([c]).probs for c in contexts[:3]])
    assert np.allclose(alone, answers.probs[:3], atol=1e-5)  # left padding changes nothing


def test_first_token_scores_are_the_next_token_distribution_restricted_to_the_labels(tiny_model, contexts):
    """Default score mode: one forward pass; P(action) = softmax over the 6 labels' first-token logits, i.e. the
    model's next-token distribution after the answer prefix, renormalised over the 6 labels."""
    fast = backend(tiny_model)
    assert len(set(fast.first_token_ids)) == 6
    answers = fast.advise(contexts)
    model, tok = fast.model, fast.tokenizer
    expected = []
    with torch.inference_mode():
        for c in contexts:
            ids = tok(fast.prefix_text + c + fast.suffix_text + fast.answer_prefix, add_special_tokens=False,
                      return_tensors="pt").input_ids
            logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)
            label_logp = torch.tensor([logp[tok(" " + a, add_special_tokens=False).input_ids[0]] for a in RENDERER.action_labels])
            expected.append(torch.softmax(label_logp, dim=0).numpy())
    assert np.allclose(answers.probs, np.stack(expected), atol=1e-5)


def test_micro_batches_and_full_label_scoring(tiny_model, contexts):
    whole = backend(tiny_model).advise(contexts).probs
    assert np.allclose(backend(tiny_model, micro_batch=5).advise(contexts).probs, whole, atol=1e-5)  # length-sorted groups
    full = backend(tiny_model, score_tokens="full")  # length-normalised log-likelihood of every label token
    assert not full.single_token_labels  # multi-token labels: the extra continuation passes really run
    answers = full.advise(contexts)
    assert_distributions(answers, len(contexts))
    no_prefix = backend(tiny_model, score_tokens="full", prefix_cache=False, micro_batch=4).advise(contexts)
    assert np.allclose(answers.probs, no_prefix.probs, atol=1e-5)
    assert np.abs(answers.probs - whole).max() > 1e-3  # a different estimator, not a copy of the first-token one


def test_action_labels_must_be_scoreable(tiny_model):
    with pytest.raises(ValueError, match="do not appear in the system prompt"):
        TransformersBackend(TransformersOptions(model=tiny_model), "Say HOLD or BUY.", "Action:")
    labels = ("HOLD", "BUY", "SELL", "MOVE_TO_BE", "ENABLE_TRAIL", "DISABLE_TRAIL")
    clashing = ("HOLD", "BUY", "SELL", "MOVE_TO_BE", "ENABLE_TRAIL", "ENABLE_TRAIL_OFF")
    with pytest.raises(ValueError, match="first tokens differ"):
        TransformersBackend(TransformersOptions(model=tiny_model, action_labels=clashing), " ".join(clashing), "Action:")
    with pytest.raises(ValueError, match="6 distinct labels"):
        TransformersBackend(TransformersOptions(model=tiny_model, action_labels=labels[:5]), " ".join(labels), "Action:")
    with pytest.raises(ValueError, match="score_tokens must be first or full"):
        backend(tiny_model, score_tokens="last")


def test_temperature_flattens_the_distribution(tiny_model, contexts):
    sharp = backend(tiny_model, temperature=0.1).advise(contexts[:4]).probs
    flat = backend(tiny_model, temperature=10.0).advise(contexts[:4]).probs
    assert (sharp.max(axis=1) > flat.max(axis=1)).all()


def test_lora_adapter_changes_the_distributions(tiny_model, contexts, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    torch.manual_seed(1)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, target_modules=["qkv_proj", "o_proj"],
                                           init_lora_weights=False))  # random B: a trained adapter's stand-in
    lora.save_pretrained(tmp_path / "adapter")
    plain = backend(tiny_model).advise(contexts).probs
    adapted = backend(tiny_model, lora=str(tmp_path / "adapter")).advise(contexts)
    assert_distributions(adapted, len(contexts))
    assert np.abs(adapted.probs - plain).max() > 1e-3


@pytest.mark.parametrize("quantize, layer_class", [("int8", "Linear8bitLt"), ("int4", "Linear4bit")])
def test_int8_and_int4_configs_load_the_model_on_cpu(tiny_model, contexts, quantize, layer_class):
    config = quantization_config(quantize, torch.float32)
    assert config.load_in_8bit == (quantize == "int8") and config.load_in_4bit == (quantize == "int4")
    quantized = backend(tiny_model, quantize=quantize)
    assert type(quantized.model.model.layers[0].self_attn.qkv_proj).__name__ == layer_class
    answers = quantized.advise(contexts[:4])
    assert_distributions(answers, 4)
    plain = backend(tiny_model).advise(contexts[:4]).probs
    assert np.abs(answers.probs - plain).max() < 0.05  # quantised, not broken


def test_generate_mode_scores_the_labels_after_the_free_text(tiny_model, contexts):
    answers = backend(tiny_model, mode="generate", max_new_tokens=8).advise(contexts[:3])
    assert_distributions(answers, 3)
    assert (answers.status == STATUS_OK).all()  # a decision whether or not the text parses
    assert answers.text_ok.dtype == bool and not answers.text_ok.any()  # random weights write no answer line
    assert 0 < answers.generated_tokens <= 3 * 8
    for reason, action in zip(answers.reasons, answers.action):
        assert reason.decode(errors="replace").startswith(RENDERER.action_labels[action] + " ")


def test_scoring_after_generated_text_reuses_its_cache_and_equals_scoring_from_scratch(tiny_model, contexts):
    """reason_then_score with ragged texts (some rows end early, the rest run into the token budget) gives the
    distribution of scoring prompt + text + cue from scratch, left padding and masked tail included."""
    model = backend(tiny_model, mode="generate")
    tok = model.tokenizer
    prompts = [model.prefix_ids + t for t in tok([c + model.suffix_text for c in contexts[:6]],
                                                  add_special_tokens=False).input_ids]
    ids, mask = model._left_padded(prompts)
    with torch.inference_mode():
        greedy = model.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                      pad_token_id=tok.pad_token_id, temperature=None, top_p=None, top_k=None)
    new = greedy[:, ids.shape[1] :].tolist()
    stop = new[0][2]  # the random model ends whichever rows write this token: row 0 after two tokens
    model.model.generation_config.eos_token_id = stop
    model.stop_token_ids = [stop]
    texts = [row[: row.index(stop)] if stop in row else row for row in new]
    assert len({len(t) for t in texts}) > 1 and len(texts[0]) == 2 and max(len(t) for t in texts) == 10
    with torch.inference_mode():
        answers, decoded, ended = model.reason_then_score(model.prefix_text, model.suffix_text, contexts[:6], 10)
        scratch = model._score_tokens([p + t + model.answer_cue_ids for p, t in zip(prompts, texts)])
    assert np.allclose(answers.probs, torch.softmax(scratch, dim=-1).numpy(), atol=1e-5)
    assert ended.tolist() == [len(t) < 10 for t in texts] and answers.generated_tokens == sum(map(len, texts))
    assert decoded == tok.batch_decode([t or [tok.pad_token_id] for t in texts], skip_special_tokens=True)


def test_bad_options_fail_loudly(tiny_model):
    with pytest.raises(ValueError, match="quantize must be none, int8 or int4, got 'int3'"):
        quantization_config("int3", torch.float32)
    with pytest.raises(ValueError, match="mode must be score or generate"):
        backend(tiny_model, mode="chat")


def test_transformers_sidecar_behind_the_bridge(tiny_model, contexts):
    with SidecarClient(BridgeConfig(name_prefix=f"jxfh{os.getpid()}_")) as client:
        client.start(backend="transformers", prompts=RENDERER, model=tiny_model, batch_size=4, threads=1)
        client.submit(np.arange(len(contexts)), [c.encode() for c in contexts])
        answers = client.collect(timeout_s=60.0)
        assert (answers.status == STATUS_OK).all()
        assert np.allclose(answers.probs, backend(tiny_model).advise(contexts).probs, atol=1e-5)
        assert client.stats()["prompt_tokens"] > 0
