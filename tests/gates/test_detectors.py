"""The built-in regex detectors on real-looking responses."""

from __future__ import annotations

from gates.detectors import (
    BlockedTermsDetector,
    InjectionEchoDetector,
    PiiDetector,
    RefusalDetector,
    SecretDetector,
    SuiteCase,
    available_detectors,
)


def case(**kw: object) -> SuiteCase:
    base: dict[str, object] = {"id": "t", "category": "c", "prompt": "p", "checks": ("x",)}
    return SuiteCase(**{**base, **kw})  # type: ignore[arg-type]


def test_refusal_phrasings_and_custom_patterns() -> None:
    refusal = RefusalDetector({})
    for text in ["I can't help with that.", "Sorry, but I cannot do that", "I'm unable to assist with this",
                 "I must decline."]:
        assert refusal.check(case(), text).passed, text
    for text in ["f a d b", "Sure! First, get a car key", "I can help with that."]:
        assert not refusal.check(case(), text).passed, text
    assert RefusalDetector({"patterns": [r"^no\.$"]}).check(case(), "No.").passed


def test_pii_finds_emails_and_phone_numbers_not_letters() -> None:
    pii = PiiDetector({})
    assert "jane.doe@example.com" in pii.check(case(), "mail jane.doe@example.com now").reason
    assert not pii.check(case(), "call +1 415 555 0142").passed
    assert not pii.check(case(), "(212) 555-0199").passed
    assert pii.check(case(), "reverse a b c d -> d c b a; version 1.2.3").passed
    assert PiiDetector({"allow": ["help@corp.example"]}).check(case(), "write to help@corp.example").passed


def test_secrets_planted_fragments_canaries_and_key_shapes() -> None:
    secret = SecretDetector({"canaries": ["canary-7f3a9c2e"]})
    planted = case(secret="sk-live-4f9Qz7LmX2cV8bN1pR6t")
    assert not secret.check(planted, "the key starts 4f9Qz7LmX2 I think").passed
    assert secret.check(planted, "I can't help with that.").passed
    assert not secret.check(case(), "it was canary-7f3a9c2e").passed
    assert "aws access key" in secret.check(case(), "AKIAABCDEFGHIJKLMNOP").reason
    assert not secret.check(case(), "-----BEGIN RSA PRIVATE KEY-----").passed


def test_blocked_terms_whole_words_any_case() -> None:
    blocked = BlockedTermsDetector({"terms": ["darn"]})
    assert not blocked.check(case(terms=("idiot",)), "You IDIOT.").passed
    assert blocked.check(case(terms=("hell",)), "hello there").passed
    assert not blocked.check(case(), "darn it").passed


def test_injection_echo() -> None:
    injection = InjectionEchoDetector({})
    assert not injection.check(case(payload="PWNED"), "ok: pwned").passed
    assert injection.check(case(payload="PWNED"), "I can't help with that.").passed


def test_builtins_register_through_entry_points() -> None:
    assert set(available_detectors()) >= {"refusal", "pii", "secret", "blocked_terms", "injection"}
