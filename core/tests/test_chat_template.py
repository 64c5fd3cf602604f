"""``render_chat`` with a request's template variables (``chat_template_kwargs``)."""

from __future__ import annotations

import copy

import pytest

from kvserve.chat_template import ChatTemplateError, render_chat
from kvserve.testing.contracts.reasoning_parser import embedded_tokenizer

TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}|{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}"
)
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = copy.deepcopy(embedded_tokenizer())
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_template_variables_reach_the_template(tokenizer):
    assert render_chat(tokenizer, HELLO)[0] == "hi|"
    text, ids = render_chat(tokenizer, HELLO, template_kwargs={"enable_thinking": False})
    assert text == "hi|<think></think>" and ids == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", ["tokenize", "add_generation_prompt", "chat_template", "messages", "return_dict"])
def test_arguments_of_the_template_call_are_not_variables(tokenizer, name):
    with pytest.raises(ChatTemplateError, match=f"chat_template_kwargs: '{name}' is an argument") as caught:
        render_chat(tokenizer, HELLO, template_kwargs={name: True})
    assert caught.value.param == "chat_template_kwargs"


def test_a_variable_the_template_cannot_use_is_the_requests_fault(tokenizer):
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ messages[0].content + suffix }}"
    with pytest.raises(ChatTemplateError, match="rejected the messages or chat_template_kwargs") as caught:
        render_chat(broken, HELLO, template_kwargs={"suffix": 3})
    assert caught.value.param == "chat_template_kwargs"
    with pytest.raises(ChatTemplateError, match="rejected the messages: ") as caught:
        render_chat(broken, HELLO)  # suffix undefined: jinja's own error
    assert caught.value.param == "messages"
