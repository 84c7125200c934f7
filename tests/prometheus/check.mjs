// Checks PromQL expressions and prometheus-operator objects with real tools, for
// tests/project/test_monitoring.py (through tests/support/prometheus.py).
//
// stdin: {"exprs": ["...", ...], "objects": [{apiVersion, kind, ...}, ...]}
// stdout: {"exprs": [{expr, type, diagnostics, syntax_errors, selectors, grouping}],
//          "objects": [{kind, name, errors}]}
//
// - PromQL: parsed by the Lezer grammar of Prometheus' web UI (@prometheus-io/lezer-promql);
//   every error node anywhere in the tree is reported (syntax_errors), and the tree is type-checked
//   by codemirror-promql's Parser, a port of Prometheus' own parser checks (checkAST in
//   promql/parser/parse.go: argument types and counts of functions, aggregations, binary
//   operators, vector matching); its messages are the diagnostics. `type` is the expression's
//   value type (vector, scalar, matrix, string). `selectors` lists each series selector: metric
//   name, label matchers, and the function that takes its range (rate, increase, ...) if any;
//   `grouping` the label names of by/without/on/ignoring/group_left/group_right clauses.
// - Objects: validated by the models @kubernetes-models/prometheus-operator generates from the
//   prometheus-operator CRDs' OpenAPI schemas (required fields, types, duration patterns).
import { createRequire } from 'node:module';
import * as operator from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';

const require = createRequire(import.meta.url);
const { EditorState } = require('@codemirror/state');
const { ensureSyntaxTree } = require('@codemirror/language');
const { promQLLanguage, LanguageType } = require('@prometheus-io/codemirror-promql');
const { Parser } = require('@prometheus-io/codemirror-promql/dist/cjs/parser');
const { getType } = require('@prometheus-io/codemirror-promql/dist/cjs/parser/type');
const { ValueType } = require('@prometheus-io/codemirror-promql/dist/cjs/types');

const language = promQLLanguage(LanguageType.PromQL);
const TYPES = Object.fromEntries(Object.entries(ValueType).map(([k, v]) => [v, k]));
const OPS = { EqlSingle: '=', Neq: '!=', EqlRegex: '=~', NeqRegex: '!~' };

function unquote(text) {
  // PromQL strings: "..." or '...' with Go escapes, or `...` raw.
  if (text.startsWith('`')) return text.slice(1, -1);
  return JSON.parse('"' + text.slice(1, -1).replace(/\\'/g, "'").replace(/(?<!\\)"/g, '\\"') + '"');
}

function checkExpr(expr) {
  const state = EditorState.create({ doc: expr, extensions: language });
  // syntaxTree(state) returns what a parse finished within CodeMirror's editor time budget (tens
  // of ms): on a loaded machine that is a partial tree, whose cut shows as syntax errors. Parse to
  // the end whatever it takes; null only if even a minute was not enough.
  const tree = ensureSyntaxTree(state, state.doc.length, 60_000);
  if (tree === null) throw new Error(`PromQL parse of ${JSON.stringify(expr)} did not finish in 60 s`);
  const parser = new Parser(state);
  parser.analyze();
  const result = {
    expr,
    complete: tree.length >= state.doc.length,
    type: TYPES[getType(tree.topNode.firstChild)] ?? null,
    diagnostics: parser.getDiagnostics().map((d) => `${d.severity}: ${d.message} at ${d.from}..${d.to}`),
    syntax_errors: [],
    selectors: [],
    grouping: [],
  };
  const text = (n) => state.sliceDoc(n.from, n.to);
  tree.iterate({
    enter(ref) {
      const n = ref.node;
      if (n.type.isError) {
        result.syntax_errors.push(`unexpected input at ${n.from}: ${JSON.stringify(expr.slice(n.from, n.from + 20))}`);
      } else if (n.name === 'GroupingLabels') {
        for (const l of n.getChildren('LabelName')) result.grouping.push(text(l));
      } else if (n.name === 'VectorSelector') {
        const id = n.getChild('Identifier');
        const matchers = [];
        const list = n.getChild('LabelMatchers');
        for (let m = list ? list.firstChild : null; m; m = m.nextSibling) {
          if (m.name !== 'UnquotedLabelMatcher' && m.name !== 'QuotedLabelMatcher') continue;
          const name = m.getChild('LabelName') ?? m.getChild('QuotedLabelName');
          const op = m.getChild('MatchOp')?.firstChild;
          const value = m.getChild('StringLiteral');
          matchers.push({
            name: name.name === 'QuotedLabelName' ? unquote(text(name)) : text(name),
            op: op ? OPS[op.name] : null,
            value: value ? unquote(text(value)) : null,
          });
        }
        let rangeFn = null;
        const matrix = n.parent?.name === 'MatrixSelector' ? n.parent : null;
        const call = matrix?.parent?.parent; // MatrixSelector < FunctionCallBody < FunctionCall
        if (call?.name === 'FunctionCall') rangeFn = text(call.getChild('FunctionIdentifier'));
        result.selectors.push({ metric: id ? text(id) : null, matchers, range: !!matrix, range_function: rangeFn });
      }
    },
  });
  return result;
}

function checkObject(obj) {
  const Model = operator[obj.kind];
  const out = { kind: obj.kind, name: obj.metadata?.name ?? null, errors: [] };
  if (!Model || obj.apiVersion !== Model.apiVersion) {
    out.errors.push(`no prometheus-operator model for ${obj.apiVersion} ${obj.kind}`);
    return out;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    out.errors.push(String(e.message ?? e));
  }
  return out;
}

let input = '';
for await (const chunk of process.stdin) input += chunk;
const request = JSON.parse(input);
process.stdout.write(JSON.stringify({
  exprs: (request.exprs ?? []).map(checkExpr),
  objects: (request.objects ?? []).map(checkObject),
}));
