// The switches a chat template documents: variables it reads that transformers does not pass itself
// (apply_chat_template's extra keyword arguments reach the template as variables, e.g. Qwen3's
// `enable_thinking=False`) and that it only uses as booleans: as a condition (`if x`, `not x`,
// `x and y` in a condition, `a if x else b`) or in a test (`x is false`, `x is defined`). A variable
// used for its value anywhere (`{{ x }}`, `x == 'a'`, `x.y`, a filter's input) is not a switch: its
// values are not two, so no finite set of wraps covers it, and it is left absent as before.

/** What transformers' render_jinja_template passes (and the Jinja globals it installs): never a switch. */
const PASSED = new Set([
  'messages', 'tools', 'documents', 'add_generation_prompt',
  'bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token', 'additional_special_tokens',
  'raise_exception', 'strftime_now', 'dict', 'namespace',
  // Jinja's own names.
  'range', 'lipsum', 'cycler', 'joiner', 'loop', 'caller', 'varargs', 'kwargs',
  'true', 'false', 'none', 'True', 'False', 'None',
]);

/** Tests that read a variable as a boolean, and tests that read nothing of its value. */
const BOOLEAN_TESTS = new Set(['true', 'false', 'boolean']);
const VALUE_FREE_TESTS = new Set(['defined', 'undefined', 'none']);

type Position = 'boolean' | 'value' | 'value-free';

interface AstNode {
  type?: string;
  [k: string]: unknown;
}

/**
 * The template's switches, in the order they first appear: free variables (not passed by
 * transformers, not bound by the template's set/for/macro) read only as booleans, at least once
 * as a condition or a true/false test. `program` is @huggingface/jinja's parsed Program.
 */
export function templateSwitches(program: unknown): string[] {
  const bound = new Set<string>();
  const uses = new Map<string, { boolean: boolean; value: boolean }>();
  const use = (name: string, at: Position) => {
    const u = uses.get(name) ?? { boolean: false, value: false };
    if (at === 'boolean') u.boolean = true;
    if (at === 'value') u.value = true;
    uses.set(name, u);
  };
  const bind = (n: unknown) => {
    const node = n as AstNode | null;
    if (!node) return;
    if (node.type === 'Identifier') bound.add(node.value as string);
    else if (node.type === 'TupleLiteral') (node.value as unknown[]).forEach(bind);
    else if (node.type === 'KeywordArgumentExpression') {
      bind(node.key);
      visit(node.value, 'value');
    } else visit(node, 'value'); // an assignment to a member (ns.x = ...): reads ns
  };

  function visit(n: unknown, at: Position): void {
    if (Array.isArray(n)) return n.forEach((s) => visit(s, 'value'));
    if (n instanceof Map) {
      for (const [k, v] of n) visit(k, 'value'), visit(v, 'value');
      return;
    }
    if (typeof n !== 'object' || n === null) return;
    const node = n as AstNode;
    const op = (node.operator as { value?: string } | undefined)?.value;
    switch (node.type) {
      case 'Identifier':
        return use(node.value as string, at);
      case 'If':
        visit(node.test, 'boolean');
        return visit([node.body, node.alternate], 'value');
      case 'Ternary':
        visit(node.condition, 'boolean');
        return visit(node.trueExpr, at), visit(node.falseExpr, at);
      case 'SelectExpression':
        visit(node.lhs, at);
        return visit(node.test, 'boolean');
      case 'UnaryExpression':
        return visit(node.argument, op === 'not' ? 'boolean' : 'value');
      case 'BinaryExpression': {
        // `x and y` in a condition reads both as booleans; elsewhere it yields one of them, a value.
        const side = (op === 'and' || op === 'or') && at === 'boolean' ? 'boolean' : 'value';
        return visit(node.left, side), visit(node.right, side);
      }
      case 'TestExpression': {
        const test = (node.test as AstNode).value as string;
        return visit(node.operand, BOOLEAN_TESTS.has(test) ? 'boolean' : VALUE_FREE_TESTS.has(test) ? 'value-free' : 'value');
      }
      case 'MemberExpression':
        visit(node.object, 'value');
        return node.computed ? visit(node.property, 'value') : undefined; // x.name: a key, not a variable
      case 'FilterExpression':
        visit(node.operand, 'value');
        return (node.filter as AstNode).type === 'CallExpression' ? visit((node.filter as AstNode).args, 'value') : undefined;
      case 'FilterStatement':
        if ((node.filter as AstNode).type === 'CallExpression') visit((node.filter as AstNode).args, 'value');
        return visit(node.body, 'value');
      case 'KeywordArgumentExpression':
        return visit(node.value, 'value');
      case 'For':
        bind(node.loopvar);
        return visit([node.iterable, node.body, node.defaultBlock], 'value');
      case 'SetStatement':
        bind(node.assignee);
        return visit([node.value, node.body], 'value');
      case 'Macro':
        bind(node.name);
        (node.args as unknown[]).forEach(bind);
        return visit(node.body, 'value');
      case 'CallStatement':
        ((node.callerArgs as unknown[] | null) ?? []).forEach(bind);
        return visit([node.call, node.body], 'value');
      default:
        for (const [k, v] of Object.entries(node)) if (k !== 'type' && k !== 'operator') visit(v, 'value');
    }
  }
  visit(program, 'value');
  return [...uses].filter(([name, u]) => u.boolean && !u.value && !bound.has(name) && !PASSED.has(name)).map(([name]) => name);
}
