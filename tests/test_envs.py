"""verirl.envs: tool schemas, the calculator, the tool-call parsers, veRL tool configs, TRL environment
classes, user environments, and ToolEnvironment.step end to end (real tool workers, the real sandbox)."""
from __future__ import annotations

import json
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from verirl.core.errors import ConfigError
from verirl.envs import (EnvStep, PARSERS, ToolCall, build_environments, calculator, function_tool, parser_for,
                         pick_parser)
from verirl.envs.parsers import MAX_CALL_CHARS, MAX_CALLS
from verirl.envs.tools import HARD_MAX_CHARS, TRUNCATED, ToolError, builtin_tool, cut

LINUX = sys.platform.startswith("linux")


def prompt(label="72", messages=None, **extra):
    # verirl.core.types.Prompt's fields (that module imports torch; the envs never need it)
    return SimpleNamespace(messages=messages or [{"role": "user", "content": "What is 4821 * 317?"}], label=label,
                           task="mul", ids=[], extra=extra)


def call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


# ----------------------------------------------------------------------------- schemas


def test_function_tool_schema_from_signature_and_docstring():
    def convert(amount: float, unit: str, exact: bool = False) -> str:
        """Convert an amount to another unit.

        Args:
            amount: How much.
            unit: The unit to convert to.
            exact: Whether to keep every digit.
        """
        return ""

    tool = function_tool(convert)
    assert tool.name == "convert" and tool.kind == "local" and tool.fn is convert
    assert tool.schema == {"type": "function", "function": {
        "name": "convert", "description": "Convert an amount to another unit.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "description": "How much."},
            "unit": {"type": "string", "description": "The unit to convert to."},
            "exact": {"type": "boolean", "description": "Whether to keep every digit."}},
            "required": ["amount", "unit"]},
        "return": {"type": "string"}}}
    assert tool.parameters["required"] == ["amount", "unit"]


def test_function_tool_without_a_docstring_names_the_fix():
    def bare(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match=r"tool 'my\.py:bare'.*Args:"):
        function_tool(bare, spec="my.py:bare")


def test_builtin_schemas():
    calc = builtin_tool("calculator").schema["function"]
    assert calc["name"] == "calculator" and calc["parameters"]["required"] == ["expression"]
    py = builtin_tool("python")
    assert py.kind == "program" and py.schema["function"]["parameters"]["required"] == ["code"]


# ----------------------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, value", [
    ("4821*317", "1528257"),  # 4821 * 317 = 4821 * 300 + 4821 * 17 = 1446300 + 81957
    ("2**10", "1024"),
    ("(3+4)*5", "35"),
    ("7/2", "3.5"),
    ("7//2", "3"),
    ("-7 % 3", "2"),  # Python's modulo takes the divisor's sign
    ("-2**2", "-4"),  # ** binds tighter than unary minus
    ("2**-2", "0.25"),
    (" 1.5 * 4 ", "6.0"),
    ("10**999 - 10**999", "0"),
])
def test_calculator(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, why", [
    ("1/0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("9**9**9", "more than 1000 digits"),
    ("2**100000", "more than 1000 digits"),
    ("10**999 * 10**999", "more than 1000 digits"),
    ("1e308 * 10", "too large"),
    ("__import__('os')", "not Call"),
    ("os", "names such as 'os'"),
    ("(lambda: 1)()", "not Call"),
    ("[1, 2]", "not List"),
    ("'a' * 3", "is not a number"),
    ("True + 1", "is not a number"),
    ("1j", "is not a number"),
    ("1 +", "not an arithmetic expression"),
    ("(-8) ** 0.5", "not a real number"),
    ("1+" * 150 + "1", "at most 200"),
    ("", "empty"),
])
def test_calculator_refuses(expression, why):
    with pytest.raises(ToolError, match=why):
        calculator(expression)


def test_calculator_huge_power_is_refused_at_once():
    start = time.perf_counter()
    for _ in range(10):
        with pytest.raises(ToolError):
            calculator("9**9**9")
        with pytest.raises(ToolError):
            calculator("(2**4000)**(2**4000)")
    assert time.perf_counter() - start < 0.1


# ----------------------------------------------------------------------------- parsers

TOOLS = {"calculator": builtin_tool("calculator").parameters,
         "convert": {"type": "object", "properties": {"amount": {"type": "number"}, "unit": {"type": "string"}},
                     "required": ["amount"]}}


def test_hermes_reads_qwen_calls():
    turn = ("I will compute it.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"4821*317\"}}\n"
            "</tool_call>\n<tool_call>\n{\"name\": \"convert\", \"arguments\": {\"amount\": 3, \"unit\": \"km\"}}\n"
            "</tool_call><|im_end|>")
    calls, errors = PARSERS["hermes"](turn, TOOLS)
    assert errors == []
    assert calls == [ToolCall("calculator", {"expression": "4821*317"}, 0), ToolCall("convert", {"amount": 3, "unit": "km"}, 1)]


def test_hermes_skips_reasoning_and_reads_string_arguments():
    turn = ('<think>maybe <tool_call>{"name": "nope"}</tool_call>?</think>\n\n<tool_call>\n'
            '{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}\n</tool_call>')
    assert PARSERS["hermes"](turn, TOOLS) == ([ToolCall("calculator", {"expression": "1+1"}, 0)], [])
    # an open block at the end (the engine stopped before </tool_call>) is read when its JSON is whole
    assert PARSERS["hermes"]('<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}', TOOLS)[0] == [
        ToolCall("calculator", {"expression": "2"}, 0)]


def test_hermes_answer_is_no_call():
    assert PARSERS["hermes"]("The answer is 1528257.<|im_end|>", TOOLS) == ([], [])


@pytest.mark.parametrize("body, why", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}', "not valid JSON"),
    ('{"name": "search", "arguments": {}}', "there is no tool named 'search'; the tools are: calculator, convert"),
    ('{"name": "calculator", "arguments": [1, 2]}', "\"arguments\" must be a JSON object, not array"),
    ('{"name": "calculator", "arguments": {}}', "missing required parameter 'expression'"),
    ('{"name": "calculator", "arguments": {"expression": "1", "x": 2}}', "unexpected parameter 'x'"),
    ('{"name": "calculator", "arguments": {"expression": 12}}', "parameter 'expression' must be string, not integer"),
    ('{"name": "convert", "arguments": {"amount": true}}', "parameter 'amount' must be number, not boolean"),
    ('{"arguments": {}}', "has no \"name\""),
    ('[1]', "a tool call is a JSON object"),
    ('', "holds no call"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ('{"name": "calculator", "arguments": {"expression": "' + "1" * MAX_CALL_CHARS + '"}}', "at most 16384 are read"),
])
def test_hermes_malformed_calls_are_errors(body, why):
    calls, errors = PARSERS["hermes"](f"<tool_call>\n{body}\n</tool_call>", TOOLS)
    assert calls == [] and len(errors) == 1
    assert why in errors[0] and errors[0].startswith("tool call")


def test_hermes_good_and_bad_calls_keep_their_places():
    turn = call("nope") + call("calculator", expression="2*3") + "<tool_call>{oops</tool_call>"
    calls, errors = PARSERS["hermes"](turn, TOOLS)
    assert [c.index for c in calls] == [1]
    assert [(e.index, e.split(":")[0]) for e in errors] == [(0, "tool call 1"), (2, "tool call 3")]


def test_hermes_reads_at_most_max_calls():
    calls, errors = PARSERS["hermes"](call("calculator", expression="1") * (MAX_CALLS + 3), TOOLS)
    assert len(calls) == MAX_CALLS and errors == [f"{MAX_CALLS + 3} tool calls in one turn: only the first "
                                                  f"{MAX_CALLS} are run"]


def test_hermes_unclosed_broken_call():
    calls, errors = PARSERS["hermes"]('<tool_call>{"name": "calculator", "argu', TOOLS)
    assert calls == [] and "is not closed with </tool_call>" in errors[0]


def test_llama3_reads_json_calls():
    parse = PARSERS["llama3"]
    assert parse('{"name": "calculator", "parameters": {"expression": "4821*317"}}<|eot_id|>', TOOLS) == (
        [ToolCall("calculator", {"expression": "4821*317"}, 0)], [])
    assert parse('<|python_tag|>{"name": "convert", "parameters": {"amount": 2}}<|eom_id|>', TOOLS) == (
        [ToolCall("convert", {"amount": 2}, 0)], [])
    two = '{"name": "calculator", "parameters": {"expression": "1"}}; {"name": "convert", "arguments": {"amount": 1}}'
    assert [c.name for c in parse(two, TOOLS)[0]] == ["calculator", "convert"]
    assert parse("The answer is 3.<|eot_id|>", TOOLS) == ([], [])


@pytest.mark.parametrize("turn, why", [
    ('{"name": "calculator", "parameters": {"expression": "1"}', "tool call: not valid JSON"),
    ('{"name": "weather", "parameters": {}}', "there is no tool named 'weather'"),
    ('{"name": "calculator", "parameters": "x"}', "is a string that is not a JSON object"),
    ('{"name": "convert", "parameters": {"unit": "km"}}', "missing required parameter 'amount'"),
    ('<|python_tag|>brave_search.call(query="x")', "only JSON calls are read"),
])
def test_llama3_malformed_calls_are_errors(turn, why):
    calls, errors = PARSERS["llama3"](turn, TOOLS)
    assert calls == [] and len(errors) == 1 and why in errors[0]


def test_answer_parser_never_calls():
    assert PARSERS["answer"](call("calculator", expression="1"), TOOLS) == ([], [])


def test_auto_picks_by_template_and_unknown_names_are_refused():
    qwen = "{%- if tools %}...<tools>{{ tool | tojson }}</tools>...<tool_call>\\n{\"name\": ...}</tool_call>"
    llama = "{%- if builtin_tools is defined %}Environment: ipython{% endif %}<|python_tag|>"
    assert pick_parser("auto", qwen) == "hermes" and pick_parser("auto", llama) == "llama3"
    assert pick_parser("auto", "{{ messages }}") == "hermes" and pick_parser("auto", None) == "hermes"
    assert parser_for("llama3", qwen) is PARSERS["llama3"]
    with pytest.raises(ConfigError, match=r"rollout\.multi_turn\.parser='hermez'.*Did you mean hermes"):
        pick_parser("hermez", qwen)


def test_cut_keeps_veRLs_marker_and_a_hard_cap():
    assert cut("abcdef", 3) == "abc" + TRUNCATED and cut("abc", 3) == "abc"
    assert cut("x" * (HARD_MAX_CHARS + 5), 0) == "x" * HARD_MAX_CHARS + TRUNCATED


# ----------------------------------------------------------------------------- ToolEnvironment end to end


@pytest.fixture(scope="module")
def calc_python():
    factory = build_environments(["calculator", "python"], "", "auto", "<tool_call>", 10.0, 2, 0, True)
    yield factory
    factory.close()


def test_tool_environment_calculator_and_python(calc_python):
    assert [s["function"]["name"] for s in calc_python.schemas] == ["calculator", "python"]
    assert calc_python.parser_name == "hermes"
    env = calc_python.new()
    assert env.reset(prompt()) is None
    turn = (call("calculator", expression="4821*317") + call("python", code="print(sum(range(101)))")
            + call("calculator", expression="1/0") + "<tool_call>{oops</tool_call><|im_end|>")
    step = env.step(turn)
    assert step.observation == [
        {"role": "tool", "name": "calculator", "content": "1528257"},
        {"role": "tool", "name": "python", "content": "5050"},
        {"role": "tool", "name": "calculator", "content": "Error: division by zero"},
        {"role": "tool", "name": "error", "content": "Error: tool call 4: not valid JSON (Expecting property name "
                                                    "enclosed in double quotes: line 1 column 2 (char 1))"}]
    assert not step.done and step.reward is None
    assert {k: v for k, v in step.counts.items() if k != "tool_seconds"} == {
        "tool_calls": 3.0, "tool_errors": 1.0, "parse_errors": 1.0, "tool_timeouts": 0.0}
    assert 0 < step.counts["tool_seconds"] < 10
    final = env.step("So 4821 * 317 = 1528257.<|im_end|>")
    assert final.done and final.observation is None
    env.close()


def test_python_tool_reports_errors_and_exit_status(calc_python):
    env = calc_python.new()
    env.reset(prompt())
    out = env.step(call("python", code="print('partial')\nraise SystemExit(3)")).observation[0]["content"]
    assert out == "partial\n(exit status 3)"
    out = env.step(call("python", code="1/0")).observation[0]["content"]
    assert out.startswith("Traceback") and "ZeroDivisionError: division by zero" in out and "(exit status 1)" in out
    assert env.step(call("python", code="x = 1")).observation[0]["content"] == "(no output)"


def test_tool_results_cut_to_max_chars():
    factory = build_environments(["python"], "", "hermes", None, 10.0, 1, 20, True)
    env = factory.new()
    env.reset(prompt())
    step = env.step(call("python", code="print('y' * 1000)"))
    assert step.observation[0]["content"] == "y" * 20 + TRUNCATED
    factory.close()


def test_user_function_tools_run_in_workers(tmp_path):
    path = write(tmp_path, "my_tools.py", '''
        def convert(amount: float, unit: str) -> dict:
            """Convert meters.

            Args:
                amount: Meters.
                unit: km or cm.
            """
            return {"value": amount / 1000 if unit == "km" else amount * 100, "unit": unit}

        def fails(x: int) -> int:
            """Always fails.

            Args:
                x: Anything.
            """
            print("about to fail")
            raise ValueError(f"bad x {x}")
        ''')
    factory = build_environments([f"{path}:convert", f"{path}:fails", "calculator"], "", "hermes", None, 10.0, 1, 0,
                                 LINUX)
    assert [s["function"]["name"] for s in factory.schemas] == ["convert", "fails", "calculator"]
    env = factory.new()
    env.reset(prompt())
    step = env.step(call("convert", amount=1500, unit="km") + call("fails", x=3) + call("calculator", expression="2+2"))
    assert step.observation == [
        {"role": "tool", "name": "convert", "content": '{"value": 1.5, "unit": "km"}'},
        {"role": "tool", "name": "fails", "content": "Error: ValueError: bad x 3\nabout to fail"},
        {"role": "tool", "name": "calculator", "content": "4"}]
    assert step.counts["tool_errors"] == 1.0
    factory.close()


def test_module_function_tool(tmp_path, monkeypatch):
    write(tmp_path, "verirl_test_module_tools.py", '''
        def shout(text: str) -> str:
            """Say it louder.

            Args:
                text: What to say.
            """
            return text.upper() + "!"
        ''')
    monkeypatch.syspath_prepend(str(tmp_path))  # an installed package's module, as far as the workers know
    factory = build_environments(["verirl_test_module_tools:shout"], "", "hermes", None, 10.0, 1, 0, LINUX)
    env = factory.new()
    env.reset(prompt())
    assert env.step(call("shout", text="hi")).observation == [{"role": "tool", "name": "shout", "content": "HI!"}]
    factory.close()


def test_builder_errors_name_the_spec_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.multi_turn\.tools='calculater'.*Did you mean calculator"):
        build_environments(["calculater"], "", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"tool 'os:system': 'os' is Python's standard library"):
        build_environments(["os:system"], "", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"file 'nowhere\.py' does not exist"):
        build_environments(["nowhere.py:f"], "", "auto", None, 1, 1, 0, False)
    bad = write(tmp_path, "broken_tools.py", "import sys\nx = 1\nraise RuntimeError('no config')\n")
    with pytest.raises(ConfigError, match=r"importing '.*broken_tools\.py' raised RuntimeError: no config \(.*line 3\)"):
        build_environments([f"{bad}:f"], "", "auto", None, 1, 1, 0, False)
    cls = write(tmp_path, "cls_tools.py", "class Tool:\n    pass\n")
    with pytest.raises(ConfigError, match=r"is a class, not a plain Python function.*rollout\.multi_turn\.environment"):
        build_environments([f"{cls}:Tool"], "", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"two tools are named 'calculator'"):
        build_environments(["calculator", "calculator"], "", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"parser=answer reads no tool calls, but tools are given \(calculator\)"):
        build_environments(["calculator"], "", "answer", None, 1, 1, 0, False)


def test_no_tools_no_environment_ends_every_episode_at_once():
    factory = build_environments([], "", "auto", None, 1, 1, 0, False)
    assert factory.schemas is None
    env = factory.new()
    assert env.reset(prompt()) is None
    assert env.step(call("calculator", expression="1")).done
    factory.close()


# ----------------------------------------------------------------------------- veRL tool configs

# The shapes of veRL's own files, examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml and
# .../sandbox_fusion_tool_config.yaml (volcengine/verl, commit b178a3cd56f5), written here from what they hold,
# with a third entry naming a class of the test's own.
VERL_CONFIG = '''
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config:
      sandbox_fusion_url: "https://xxx.apigateway-cn-beijing.volceapi.com/run_code"
      num_workers: 10
      enable_global_rate_limit: true
      rate_limit: 10
      default_timeout: 30
      default_language: "python"
      memory_limit_mb: 1024
      type: native

    tool_schema:
      type: "function"
      function:
        name: "code_interpreter"
        description: "A tool for executing code."
        parameters:
          type: "object"
          properties:
            code:
              type: "string"
              description: "The code to execute."
          required: ["code"]
  - class_name: "verirl_test_tools.CounterTool"
    config:
      type: native
      step: 2
    tool_schema:
      type: function
      function:
        name: count
        description: Count up by the configured step.
        parameters:
          type: object
          properties:
            times:
              type: integer
              description: How many steps.
          required: [times]
'''

COUNTER_TOOL = '''
import asyncio

class CounterTool:
    """A tool in veRL's shape (BaseTool's methods, async), not importing veRL."""
    events = []

    def __init__(self, config, tool_schema):
        self.step, self.name = config["step"], tool_schema.function.name
        self.state = {}

    async def create(self, instance_id=None, **kwargs):
        self.state[instance_id] = 0
        self.events.append(("create", kwargs["create_kwargs"]["ground_truth"]))
        return instance_id, None

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(0)
        self.state[instance_id] += self.step * parameters["times"]
        return f"count={self.state[instance_id]}", 0.5, {}

    async def release(self, instance_id, **kwargs):
        self.events.append(("release", self.state.pop(instance_id)))
'''


def test_verl_tool_config(tmp_path, monkeypatch):
    write(tmp_path, "verirl_test_tools.py", COUNTER_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = write(tmp_path, "tool_config.yaml", VERL_CONFIG)
    factory = build_environments([config], "", "auto", "<tool_call>", 10.0, 1, 0, True)
    names = [s["function"]["name"] for s in factory.schemas]
    assert names == ["calc_gsm8k_reward", "code_interpreter", "count"]
    assert factory.schemas[1] == {"type": "function", "function": {
        "name": "code_interpreter", "description": "A tool for executing code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}},
                       "required": ["code"]}}}
    env = factory.new()
    env.reset(prompt(label="72"))
    step = env.step(call("calc_gsm8k_reward", answer="70") + call("code_interpreter", code="print(8 * 9)")
                    + call("count", times=3))
    assert [m["content"] for m in step.observation] == ["Current parsed answer='70' reward=0.0", "72", "count=6"]
    assert step.reward == pytest.approx(-0.05 + 0.5)  # gsm8k: a submission that does not improve; the counter: 0.5
    step = env.step(call("calc_gsm8k_reward", answer="72") + call("count", times=1))
    assert [m["content"] for m in step.observation] == ["Current parsed answer='72' reward=1.0", "count=8"]
    assert step.reward == pytest.approx(0.0 + 0.5)
    env.close()
    other = factory.new()  # an episode of its own: a new instance id, state from zero
    other.reset(prompt(label="5"))
    assert other.step(call("count", times=1)).observation[0]["content"] == "count=2"
    other.close()
    tool_cls = sys.modules["verirl_test_tools"].CounterTool
    assert tool_cls.events == [("create", "72"), ("release", 8), ("create", "5"), ("release", 2)]
    factory.close()


@pytest.mark.parametrize("entry, why", [
    ("  - class_name: verl.tools.geo3k_tool.Geo3kTool\n    config: {type: native}\n", "mathruler"),
    ("  - class_name: verl.tools.mcp_search_tool.MCPSearchTool\n    config: {type: mcp}\n", "MCP"),
    ("  - class_name: nowhere_pkg.tools.MyTool\n    config: {type: native}\n    tool_schema: {type: function, "
     "function: {name: t}}\n", r"cannot be imported here \(ModuleNotFoundError"),
    ("  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n", "no tool_schema"),
])
def test_verl_tool_config_refusals_name_file_entry_and_class(tmp_path, entry, why):
    path = write(tmp_path, "bad_tools.yaml", "tools:\n" + VERL_CONFIG.split("tools:\n")[1].split("  - class_name")[0]
                 + entry)
    with pytest.raises(ConfigError, match=rf"veRL tool config '.*bad_tools\.yaml', tools\[0\] \(class_name [\w.]+\): "
                                          rf".*{why}"):
        build_environments([path], "", "auto", None, 1, 1, 0, False)


def test_verl_tool_config_that_is_not_one(tmp_path):
    path = write(tmp_path, "t.yaml", "tools: {a: 1}\n")
    with pytest.raises(ConfigError, match=r"'.*t\.yaml' has no `tools:` list"):
        build_environments([path], "", "auto", None, 1, 1, 0, False)
    path = write(tmp_path, "u.yaml", "tools: [\n")
    with pytest.raises(ConfigError, match=r"'.*u\.yaml' is not YAML verirl can read"):
        build_environments([path], "", "auto", None, 1, 1, 0, False)
    path = write(tmp_path, "v.yaml", "tools:\n  - !!python/object/apply:os.system ['echo unsafe']\n")
    with pytest.raises(ConfigError, match=r"is not YAML verirl can read"):  # never unsafe loading
        build_environments([path], "", "auto", None, 1, 1, 0, False)


# ----------------------------------------------------------------------------- TRL environment classes

TRL_ENV = '''
class IncrementEnv:
    """TRL's environment_factory convention (trl's demo_grpo_environment.py): reset() and tool methods."""

    def __init__(self):
        self.counter = 0

    def reset(self, prompt, label, **kwargs):
        self.counter = 0
        self.target = int(label)
        return f"Reach {self.target}. The counter is at 0."

    def increment(self, a: int) -> int:
        """
        Increment the counter by a specified value

        Args:
            a: The value to increment by

        Returns:
            The incremented integer.
        """
        self.counter += a
        return self.counter

    def peek(self) -> str:
        """Say where the counter stands."""
        return f"at {self.counter}"

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else -abs(self.counter - self.target) / 10

    def _private(self):
        pass
'''


def test_trl_environment_class(tmp_path):
    path = write(tmp_path, "trl_env.py", TRL_ENV)
    factory = build_environments(["calculator"], f"{path}:IncrementEnv", "hermes", None, 10.0, 1, 0, False)
    assert [s["function"]["name"] for s in factory.schemas] == ["calculator", "increment", "peek"]
    assert factory.schemas[1]["function"]["parameters"] == {
        "type": "object", "properties": {"a": {"type": "integer", "description": "The value to increment by"}},
        "required": ["a"]}
    env = factory.new()
    assert env.reset(prompt(label="5")) == [{"role": "user", "content": "Reach 5. The counter is at 0."}]
    first = env.step(call("increment", a=2) + call("peek"))
    assert [m["content"] for m in first.observation] == ["2", "at 2"]
    assert first.reward == pytest.approx(-0.3)  # get_reward after a turn that called the environment
    second = env.step(call("calculator", expression="5-2") + call("increment", a=3))
    assert second.reward == pytest.approx(1.0 - -0.3)  # the increment: the episode's rewards sum to get_reward()
    last = env.step("Done.")
    assert last.done and last.reward is None  # no change since
    assert first.reward + second.reward == pytest.approx(1.0)
    env.close()
    other = factory.new()  # one instance per episode
    other.reset(prompt(label="1"))
    assert other.step("I give up.").reward == pytest.approx(-0.1)  # get_reward of the state reset left
    factory.close()


# ----------------------------------------------------------------------------- user environments

GUESS_ENV = '''
from verirl.envs import EnvStep

class Guess:
    """Guess the label: the environment says higher or lower, 1.0 for the right number."""

    def reset(self, prompt):
        self.target, self.tries = int(prompt.label), 0
        return [{"role": "user", "content": "Guess a number from 1 to 100."}]

    def step(self, turn):
        self.tries += 1
        digits = "".join(ch for ch in turn if ch.isdigit())
        if not digits:
            return EnvStep([{"role": "user", "content": "Say a number."}], reward=-0.1)
        guess = int(digits)
        if guess == self.target:
            return EnvStep(None, reward=1.0, done=True)
        return "higher" if guess < self.target else "lower", 0.0, False

class Broken:
    def reset(self, prompt):
        return None

    def step(self, turn):
        raise KeyError("no state")
'''


def test_user_environment_from_a_file(tmp_path, capsys):
    path = write(tmp_path, "guess_env.py", GUESS_ENV)
    factory = build_environments([], f"{path}:Guess", "auto", None, 5.0, 1, 0, False)
    assert factory.schemas is None
    env = factory.new()
    assert env.reset(prompt(label="42")) == [{"role": "user", "content": "Guess a number from 1 to 100."}]
    assert env.step("50") == EnvStep([{"role": "user", "content": "lower"}], 0.0, False, env.step("50").counts)
    assert env.step("hmm").observation == [{"role": "user", "content": "Say a number."}]
    done = env.step("42")
    assert done.done and done.reward == 1.0 and done.observation is None
    env.close()
    factory.close()

    # with a tool: tool calls are the tools', the rest is the environment's
    factory = build_environments(["calculator"], f"{path}:Guess", "auto", None, 5.0, 1, 0, False)
    env = factory.new()
    env.reset(prompt(label="42"))
    assert env.step(call("calculator", expression="6*7")).observation[0]["content"] == "42"
    assert env.step("42").done
    factory.close()

    factory = build_environments([], f"{path}:Broken", "auto", None, 5.0, 1, 0, False)
    env = factory.new()
    env.reset(prompt())
    step = env.step("1")
    assert step.done and step.counts["tool_errors"] == 1.0
    assert "rollout.multi_turn.environment" in capsys.readouterr().err
    factory.close()


def test_environment_specs_that_are_not_environments(tmp_path):
    path = write(tmp_path, "envs_bad.py", "def f():\n    pass\n\nclass Nothing:\n    pass\n")
    with pytest.raises(ConfigError, match=r"is function, not a class"):
        build_environments([], f"{path}:f", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"has neither step\(turn\) nor reset\(\)"):
        build_environments([], f"{path}:Nothing", "auto", None, 1, 1, 0, False)
    with pytest.raises(ConfigError, match=r"has no 'Missing' at its top level"):
        build_environments([], f"{path}:Missing", "auto", None, 1, 1, 0, False)
