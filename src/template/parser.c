/* parser.c: tokens to an AST, following jinja2's parser (parser.py) closely so
 * that precedence and the odd corners (filters bind tighter than unary minus's
 * operand, `is` tests with a bare argument, chained comparisons, adjacent
 * string literals concatenating) come out the same. */
#include <stdio.h>
#include <string.h>

#include "tpl_int.h"

#define MAX_NEST 300

typedef struct parser {
    tpl_arena *ar;
    const tpl_token *t;
    int n, i;
    hn_err *err;
    int status;
    int depth;
    int loops; /* enclosing for loops (for break/continue) */
} parser;

typedef struct nlist {
    tpl_node **v;
    uint32_t n, cap;
} nlist;

static const tpl_token *cur(parser *P) { return &P->t[P->i < P->n ? P->i : P->n - 1]; }
static const tpl_token *peek(parser *P, int k) {
    int j = P->i + k;
    return &P->t[j < P->n ? j : P->n - 1];
}

static int pfail(parser *P, const tpl_token *t, const char *fmt, const char *arg) {
    if (!P->status) {
        char msg[300];
        snprintf(msg, sizeof msg, fmt, arg ? arg : "");
        hn_errf(P->err, HN_ERR_FORMAT, "line %d, column %d: %s", t->line, t->col, msg);
    }
    P->status = -1;
    return -1;
}

static tpl_node *nnew(parser *P, int kind, const tpl_token *t) {
    tpl_node *n = tpl_arena_alloc(P->ar, sizeof *n);
    if (!n) {
        if (!P->status) hn_errf(P->err, HN_ERR_NOMEM, "out of memory");
        P->status = -1;
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = t->line;
    return n;
}

static int nl_push(parser *P, nlist *l, tpl_node *x) {
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 4;
        tpl_node **nv = tpl_arena_alloc(P->ar, sizeof(tpl_node *) * cap);
        if (!nv) {
            if (!P->status) hn_errf(P->err, HN_ERR_NOMEM, "out of memory");
            P->status = -1;
            return -1;
        }
        if (l->n) memcpy(nv, l->v, sizeof(tpl_node *) * l->n);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static bool is_op(parser *P, int op) { return cur(P)->kind == TK_OP && cur(P)->op == op; }
static bool tok_name(const tpl_token *t, const char *s) {
    size_t n = strlen(s);
    return t->kind == TK_NAME && t->n == n && !memcmp(t->s, s, n);
}
static bool is_name(parser *P, const char *s) { return tok_name(cur(P), s); }

static const char *tok_desc(const tpl_token *t) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_VEND: return "end of print statement";
    case TK_BEND: return "end of statement block";
    case TK_NAME: return "name";
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_OP: return "operator";
    default: return "token";
    }
}

static int expect_op(parser *P, int op, const char *what) {
    if (!is_op(P, op)) {
        char m[64];
        snprintf(m, sizeof m, "expected '%s', got %s", what, tok_desc(cur(P)));
        return pfail(P, cur(P), "%s", m);
    }
    P->i++;
    return 0;
}

static int expect_kind(parser *P, int kind, const char *what) {
    if (cur(P)->kind != kind) {
        char m[96];
        snprintf(m, sizeof m, "expected %s, got %s", what, tok_desc(cur(P)));
        return pfail(P, cur(P), "%s", m);
    }
    P->i++;
    return 0;
}

static tv tok_str(const tpl_token *t) { return tv_strn(t->s, t->n); }

static tpl_node *parse_expression(parser *P, bool with_condexpr);
static tpl_node *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                             bool explicit_parens);
static tpl_node *parse_unary(parser *P, bool with_filter);
static tpl_node *parse_filter(parser *P, tpl_node *node, bool start_inline);

/* Parses "(args, k=v)" into n->kids (keywords as N_KWARG). */
static int parse_call_args(parser *P, tpl_node *n) {
    nlist args = {0};
    bool have_kw = false, need_comma = false;
    if (expect_op(P, OP_LPAREN, "(")) return -1;
    while (!is_op(P, OP_RPAREN)) {
        if (need_comma) {
            if (expect_op(P, OP_COMMA, ",")) return -1;
            if (is_op(P, OP_RPAREN)) break;
        }
        if (is_op(P, OP_MUL) || is_op(P, OP_POW))
            return pfail(P, cur(P), "*args and **kwargs are not supported", NULL);
        if (cur(P)->kind == TK_NAME && peek(P, 1)->kind == TK_OP && peek(P, 1)->op == OP_ASSIGN) {
            tpl_node *kw = nnew(P, N_KWARG, cur(P));
            if (!kw) return -1;
            kw->lit = tok_str(cur(P));
            P->i += 2;
            if (!(kw->a = parse_expression(P, true))) return -1;
            if (nl_push(P, &args, kw)) return -1;
            have_kw = true;
        } else {
            if (have_kw) return pfail(P, cur(P), "invalid argument syntax (positional after keyword)", NULL);
            tpl_node *e = parse_expression(P, true);
            if (!e || nl_push(P, &args, e)) return -1;
        }
        need_comma = true;
    }
    P->i++;
    n->kids = args.v;
    n->nkids = args.n;
    return 0;
}

static tpl_node *parse_list(parser *P) {
    tpl_node *n = nnew(P, N_LIST, cur(P));
    nlist items = {0};
    if (!n || expect_op(P, OP_LBRACKET, "[")) return NULL;
    while (!is_op(P, OP_RBRACKET)) {
        if (items.n && expect_op(P, OP_COMMA, ",")) return NULL;
        if (is_op(P, OP_RBRACKET)) break;
        tpl_node *e = parse_expression(P, true);
        if (!e || nl_push(P, &items, e)) return NULL;
    }
    P->i++;
    n->kids = items.v;
    n->nkids = items.n;
    return n;
}

static tpl_node *parse_dict(parser *P) {
    tpl_node *n = nnew(P, N_DICT, cur(P));
    nlist items = {0};
    if (!n || expect_op(P, OP_LBRACE, "{")) return NULL;
    while (!is_op(P, OP_RBRACE)) {
        if (items.n && expect_op(P, OP_COMMA, ",")) return NULL;
        if (is_op(P, OP_RBRACE)) break;
        tpl_node *pair = nnew(P, N_PAIR, cur(P));
        if (!pair || !(pair->a = parse_expression(P, true))) return NULL;
        if (expect_op(P, OP_COLON, ":")) return NULL;
        if (!(pair->b = parse_expression(P, true))) return NULL;
        if (nl_push(P, &items, pair)) return NULL;
    }
    P->i++;
    n->kids = items.v;
    n->nkids = items.n;
    return n;
}

static tpl_node *parse_primary(parser *P) {
    const tpl_token *t = cur(P);
    tpl_node *n = NULL;
    if (++P->depth > MAX_NEST) {
        pfail(P, t, "expression nested too deeply", NULL);
        return NULL;
    }
    switch (t->kind) {
    case TK_NAME:
        if (!(n = nnew(P, N_LIT, t))) return NULL;
        if (tok_name(t, "true") || tok_name(t, "True")) n->lit = tv_bool(true);
        else if (tok_name(t, "false") || tok_name(t, "False")) n->lit = tv_bool(false);
        else if (tok_name(t, "none") || tok_name(t, "None")) n->lit = tv_none();
        else {
            n->kind = N_NAME;
            n->lit = tok_str(t);
        }
        P->i++;
        break;
    case TK_STRING:
        if (!(n = nnew(P, N_LIT, t))) return NULL;
        P->i++;
        if (cur(P)->kind != TK_STRING) {
            n->lit = tok_str(t);
        } else {
            tpl_sb b;
            tpl_sb_init(&b, P->ar, 0);
            tpl_sb_put(&b, t->s, t->n);
            while (cur(P)->kind == TK_STRING) {
                tpl_sb_put(&b, cur(P)->s, cur(P)->n);
                P->i++;
            }
            if (b.failed) {
                pfail(P, t, "out of memory", NULL);
                return NULL;
            }
            n->lit = tpl_sb_value(&b);
        }
        break;
    case TK_INT:
    case TK_FLOAT:
        if (!(n = nnew(P, N_LIT, t))) return NULL;
        n->lit = t->kind == TK_INT ? tv_int(t->i) : tv_float(t->f);
        P->i++;
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            P->i++;
            if (!(n = parse_tuple(P, false, true, NULL, true))) return NULL;
            if (expect_op(P, OP_RPAREN, ")")) return NULL;
            break;
        }
        if (t->op == OP_LBRACKET) {
            n = parse_list(P);
            break;
        }
        if (t->op == OP_LBRACE) {
            n = parse_dict(P);
            break;
        }
        /* fallthrough */
    default:
        pfail(P, t, "unexpected %s", tok_desc(t));
        return NULL;
    }
    P->depth--;
    return n;
}

/* One subscript element: an expression or a slice. */
static tpl_node *parse_subscribed(parser *P) {
    const tpl_token *t = cur(P);
    tpl_node *start = NULL, *stop = NULL, *step = NULL;
    if (is_op(P, OP_COLON)) {
        P->i++;
    } else {
        tpl_node *e = parse_expression(P, true);
        if (!e) return NULL;
        if (!is_op(P, OP_COLON)) return e;
        P->i++;
        start = e;
    }
    if (!is_op(P, OP_COLON) && !is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA))
        if (!(stop = parse_expression(P, true))) return NULL;
    if (is_op(P, OP_COLON)) {
        P->i++;
        if (!is_op(P, OP_RBRACKET) && !is_op(P, OP_COMMA))
            if (!(step = parse_expression(P, true))) return NULL;
    }
    tpl_node *s = nnew(P, N_SLICE, t);
    if (!s) return NULL;
    s->a = start;
    s->b = stop;
    s->c = step;
    return s;
}

static tpl_node *parse_postfix(parser *P, tpl_node *node) {
    for (;;) {
        const tpl_token *t = cur(P);
        if (is_op(P, OP_DOT)) {
            P->i++;
            const tpl_token *a = cur(P);
            tpl_node *n;
            if (a->kind == TK_NAME) {
                if (!(n = nnew(P, N_ATTR, t))) return NULL;
                n->lit = tok_str(a);
            } else if (a->kind == TK_INT) {
                tpl_node *k = nnew(P, N_LIT, a);
                if (!k || !(n = nnew(P, N_ITEM, t))) return NULL;
                k->lit = tv_int(a->i);
                n->b = k;
            } else {
                pfail(P, a, "expected name or number", NULL);
                return NULL;
            }
            P->i++;
            n->a = node;
            node = n;
        } else if (is_op(P, OP_LBRACKET)) {
            P->i++;
            nlist args = {0};
            while (!is_op(P, OP_RBRACKET)) {
                if (args.n && expect_op(P, OP_COMMA, ",")) return NULL;
                tpl_node *e = parse_subscribed(P);
                if (!e || nl_push(P, &args, e)) return NULL;
            }
            P->i++;
            if (args.n == 0) {
                pfail(P, t, "expected an expression in subscript", NULL);
                return NULL;
            }
            tpl_node *n = nnew(P, N_ITEM, t);
            if (!n) return NULL;
            n->a = node;
            if (args.n == 1) {
                n->b = args.v[0];
            } else {
                tpl_node *tu = nnew(P, N_TUPLE, t);
                if (!tu) return NULL;
                tu->kids = args.v;
                tu->nkids = args.n;
                n->b = tu;
            }
            node = n;
        } else if (is_op(P, OP_LPAREN)) {
            tpl_node *n = nnew(P, N_CALL, t);
            if (!n) return NULL;
            n->a = node;
            if (parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

static tpl_node *parse_test(parser *P, tpl_node *node) {
    const tpl_token *is = cur(P);
    P->i++;
    bool negated = false;
    if (is_name(P, "not")) {
        P->i++;
        negated = true;
    }
    if (cur(P)->kind != TK_NAME) {
        pfail(P, cur(P), "expected test name, got %s", tok_desc(cur(P)));
        return NULL;
    }
    tpl_node *n = nnew(P, N_TEST, is);
    if (!n) return NULL;
    n->a = node;
    n->lit = tok_str(cur(P));
    P->i++;
    const tpl_token *c = cur(P);
    if (is_op(P, OP_LPAREN)) {
        if (parse_call_args(P, n)) return NULL;
    } else if ((c->kind == TK_NAME || c->kind == TK_STRING || c->kind == TK_INT || c->kind == TK_FLOAT ||
                (c->kind == TK_OP && (c->op == OP_LPAREN || c->op == OP_LBRACKET || c->op == OP_LBRACE))) &&
               !tok_name(c, "else") && !tok_name(c, "or") && !tok_name(c, "and")) {
        if (tok_name(c, "is")) {
            pfail(P, c, "You cannot chain multiple tests with is", NULL);
            return NULL;
        }
        tpl_node *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        n->kids = tpl_arena_alloc(P->ar, sizeof(tpl_node *));
        if (!n->kids) return NULL;
        n->kids[0] = arg;
        n->nkids = 1;
    }
    if (negated) {
        tpl_node *no = nnew(P, N_NOT, is);
        if (!no) return NULL;
        no->a = n;
        return no;
    }
    return n;
}

/* node | f1(args) | f2 ...; node may be NULL for filter blocks (N_BODYVAL). */
static tpl_node *parse_filter(parser *P, tpl_node *node, bool start_inline) {
    while (is_op(P, OP_PIPE) || start_inline) {
        if (!start_inline) P->i++;
        start_inline = false;
        if (cur(P)->kind != TK_NAME) {
            pfail(P, cur(P), "expected filter name, got %s", tok_desc(cur(P)));
            return NULL;
        }
        tpl_node *n = nnew(P, N_FILTER, cur(P));
        if (!n) return NULL;
        n->lit = tok_str(cur(P));
        P->i++;
        if (!node && !(node = nnew(P, N_BODYVAL, cur(P)))) return NULL;
        n->a = node;
        if (is_op(P, OP_LPAREN) && parse_call_args(P, n)) return NULL;
        node = n;
    }
    return node;
}

static tpl_node *parse_filter_expr(parser *P, tpl_node *node) {
    for (;;) {
        if (is_op(P, OP_PIPE)) {
            if (!(node = parse_filter(P, node, false))) return NULL;
        } else if (is_name(P, "is")) {
            if (!(node = parse_test(P, node))) return NULL;
        } else if (is_op(P, OP_LPAREN)) {
            tpl_node *n = nnew(P, N_CALL, cur(P));
            if (!n) return NULL;
            n->a = node;
            if (parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

static tpl_node *parse_unary(parser *P, bool with_filter) {
    const tpl_token *t = cur(P);
    tpl_node *node;
    if (++P->depth > MAX_NEST) {
        pfail(P, t, "expression nested too deeply", NULL);
        return NULL;
    }
    if (is_op(P, OP_SUB) || is_op(P, OP_ADD)) {
        P->i++;
        if (!(node = nnew(P, N_UNARY, t))) return NULL;
        node->op = t->op == OP_SUB ? OP_NEG : OP_POS;
        if (!(node->a = parse_unary(P, false))) return NULL;
    } else {
        if (!(node = parse_primary(P))) return NULL;
    }
    if (!(node = parse_postfix(P, node))) return NULL;
    if (with_filter && !(node = parse_filter_expr(P, node))) return NULL;
    P->depth--;
    return node;
}

static tpl_node *binop(parser *P, const tpl_token *t, int op, tpl_node *l, tpl_node *r) {
    if (!l || !r) return NULL;
    tpl_node *n = nnew(P, N_BIN, t);
    if (!n) return NULL;
    n->op = (uint16_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static tpl_node *parse_pow(parser *P) {
    tpl_node *l = parse_unary(P, true);
    while (l && is_op(P, OP_POW)) {
        const tpl_token *t = cur(P);
        P->i++;
        l = binop(P, t, OP_POW, l, parse_unary(P, true));
    }
    return l;
}

static tpl_node *parse_math2(parser *P) {
    tpl_node *l = parse_pow(P);
    while (l && (is_op(P, OP_MUL) || is_op(P, OP_DIV) || is_op(P, OP_FLOORDIV) || is_op(P, OP_MOD))) {
        const tpl_token *t = cur(P);
        P->i++;
        l = binop(P, t, t->op, l, parse_pow(P));
    }
    return l;
}

static tpl_node *parse_concat(parser *P) {
    const tpl_token *t = cur(P);
    tpl_node *first = parse_math2(P);
    if (!first || !is_op(P, OP_TILDE)) return first;
    nlist args = {0};
    if (nl_push(P, &args, first)) return NULL;
    while (is_op(P, OP_TILDE)) {
        P->i++;
        tpl_node *e = parse_math2(P);
        if (!e || nl_push(P, &args, e)) return NULL;
    }
    tpl_node *n = nnew(P, N_CONCAT, t);
    if (!n) return NULL;
    n->kids = args.v;
    n->nkids = args.n;
    return n;
}

static tpl_node *parse_math1(parser *P) {
    tpl_node *l = parse_concat(P);
    while (l && (is_op(P, OP_ADD) || is_op(P, OP_SUB))) {
        const tpl_token *t = cur(P);
        P->i++;
        l = binop(P, t, t->op, l, parse_concat(P));
    }
    return l;
}

static tpl_node *parse_compare(parser *P) {
    const tpl_token *t0 = cur(P);
    tpl_node *e = parse_math1(P);
    if (!e) return NULL;
    nlist ops = {0};
    for (;;) {
        const tpl_token *t = cur(P);
        int op = 0;
        if (t->kind == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT || t->op == OP_LE ||
                                 t->op == OP_GT || t->op == OP_GE)) {
            op = t->op;
            P->i++;
        } else if (tok_name(t, "in")) {
            op = OP_IN;
            P->i++;
        } else if (tok_name(t, "not") && tok_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            P->i += 2;
        } else {
            break;
        }
        tpl_node *o = nnew(P, N_BIN, t);
        if (!o) return NULL;
        o->op = (uint16_t)op;
        if (!(o->a = parse_math1(P)) || nl_push(P, &ops, o)) return NULL;
    }
    if (!ops.n) return e;
    tpl_node *n = nnew(P, N_CMP, t0);
    if (!n) return NULL;
    n->a = e;
    n->kids = ops.v;
    n->nkids = ops.n;
    return n;
}

static tpl_node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        const tpl_token *t = cur(P);
        P->i++;
        if (++P->depth > MAX_NEST) {
            pfail(P, t, "expression nested too deeply", NULL);
            return NULL;
        }
        tpl_node *n = nnew(P, N_NOT, t);
        if (!n || !(n->a = parse_not(P))) return NULL;
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static tpl_node *parse_and(parser *P) {
    tpl_node *l = parse_not(P);
    while (l && is_name(P, "and")) {
        tpl_node *n = nnew(P, N_AND, cur(P));
        P->i++;
        if (!n) return NULL;
        n->a = l;
        if (!(n->b = parse_not(P))) return NULL;
        l = n;
    }
    return l;
}

static tpl_node *parse_or(parser *P) {
    tpl_node *l = parse_and(P);
    while (l && is_name(P, "or")) {
        tpl_node *n = nnew(P, N_OR, cur(P));
        P->i++;
        if (!n) return NULL;
        n->a = l;
        if (!(n->b = parse_and(P))) return NULL;
        l = n;
    }
    return l;
}

static tpl_node *parse_condexpr(parser *P) {
    tpl_node *e1 = parse_or(P);
    while (e1 && is_name(P, "if")) {
        tpl_node *n = nnew(P, N_COND, cur(P));
        P->i++;
        if (!n) return NULL;
        n->b = e1;
        if (!(n->a = parse_or(P))) return NULL;
        if (is_name(P, "else")) {
            P->i++;
            if (++P->depth > MAX_NEST) {
                pfail(P, cur(P), "expression nested too deeply", NULL);
                return NULL;
            }
            if (!(n->c = parse_condexpr(P))) return NULL;
            P->depth--;
        }
        e1 = n;
    }
    return e1;
}

static tpl_node *parse_expression(parser *P, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static bool is_tuple_end(parser *P, const char *extra_end) {
    const tpl_token *t = cur(P);
    if (t->kind == TK_VEND || t->kind == TK_BEND || t->kind == TK_EOF) return true;
    if (t->kind == TK_OP && t->op == OP_RPAREN) return true;
    return extra_end && tok_name(t, extra_end);
}

static tpl_node *parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                             bool explicit_parens) {
    const tpl_token *t0 = cur(P);
    nlist args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && expect_op(P, OP_COMMA, ",")) return NULL;
        if (is_tuple_end(P, extra_end)) break;
        tpl_node *e = simplified ? parse_primary(P) : parse_expression(P, with_condexpr);
        if (!e || nl_push(P, &args, e)) return NULL;
        if (is_op(P, OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            pfail(P, cur(P), "Expected an expression, got '%s'", tok_desc(cur(P)));
            return NULL;
        }
    }
    tpl_node *n = nnew(P, N_TUPLE, t0);
    if (!n) return NULL;
    n->kids = args.v;
    n->nkids = args.n;
    return n;
}

/* ---- statements ---- */

static int parse_body(parser *P, const char *const *ends, nlist *out);

static int expect_bend(parser *P) { return expect_kind(P, TK_BEND, "end of statement block"); }

static bool assignable(const tpl_node *n) {
    if (n->kind == N_NAME) return true;
    if (n->kind != N_TUPLE) return false;
    for (uint32_t i = 0; i < n->nkids; i++)
        if (n->kids[i]->kind != N_NAME) return false;
    return true;
}

/* At "{% endX %}": consumes it. */
static int expect_end_tag(parser *P, const char *name) {
    if (cur(P)->kind != TK_BBEGIN || !tok_name(peek(P, 1), name))
        return pfail(P, cur(P), "expected '%s'", name);
    P->i += 2;
    return expect_bend(P);
}

static tpl_node *parse_for(parser *P, const tpl_token *t) {
    tpl_node *n = nnew(P, S_FOR, t);
    if (!n) return NULL;
    if (!(n->a = parse_tuple(P, true, true, "in", false))) return NULL;
    if (!assignable(n->a)) {
        pfail(P, t, "can't assign to this for-loop target", NULL);
        return NULL;
    }
    if (!is_name(P, "in")) {
        pfail(P, cur(P), "expected 'in'", NULL);
        return NULL;
    }
    P->i++;
    if (!(n->b = parse_tuple(P, false, false, "recursive", false))) return NULL;
    if (is_name(P, "if")) {
        P->i++;
        if (!(n->c = parse_expression(P, true))) return NULL;
    }
    if (is_name(P, "recursive")) {
        pfail(P, cur(P), "recursive loops are not supported", NULL);
        return NULL;
    }
    if (expect_bend(P)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    nlist body = {0}, els = {0};
    P->loops++;
    if (parse_body(P, ends, &body)) return NULL;
    P->loops--;
    if (tok_name(peek(P, 1), "else")) {
        P->i += 2;
        if (expect_bend(P)) return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        if (parse_body(P, ends2, &els)) return NULL;
    }
    if (expect_end_tag(P, "endfor")) return NULL;
    n->kids = body.v;
    n->nkids = body.n;
    n->kids2 = els.v;
    n->nkids2 = els.n;
    return n;
}

static tpl_node *parse_if(parser *P, const tpl_token *t) {
    tpl_node *n = nnew(P, S_IF, t);
    if (!n) return NULL;
    if (!(n->a = parse_tuple(P, false, false, NULL, false)) || expect_bend(P)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nlist body = {0};
    if (parse_body(P, ends, &body)) return NULL;
    n->kids = body.v;
    n->nkids = body.n;
    const tpl_token *tag = peek(P, 1);
    if (tok_name(tag, "elif")) {
        P->i += 2;
        if (++P->depth > MAX_NEST) {
            pfail(P, tag, "too many elif branches", NULL);
            return NULL;
        }
        tpl_node *sub = parse_if(P, tag); /* consumes through endif */
        if (!sub) return NULL;
        P->depth--;
        n->kids2 = tpl_arena_alloc(P->ar, sizeof(tpl_node *));
        if (!n->kids2) return NULL;
        n->kids2[0] = sub;
        n->nkids2 = 1;
        return n;
    }
    if (tok_name(tag, "else")) {
        P->i += 2;
        if (expect_bend(P)) return NULL;
        static const char *const ends2[] = {"endif", NULL};
        nlist els = {0};
        if (parse_body(P, ends2, &els)) return NULL;
        n->kids2 = els.v;
        n->nkids2 = els.n;
    }
    if (expect_end_tag(P, "endif")) return NULL;
    return n;
}

static tpl_node *parse_set(parser *P, const tpl_token *t) {
    tpl_node *target;
    if (cur(P)->kind == TK_NAME && peek(P, 1)->kind == TK_OP && peek(P, 1)->op == OP_DOT) {
        if (!(target = nnew(P, N_ATTR, cur(P)))) return NULL;
        tpl_node *ns = nnew(P, N_NAME, cur(P));
        if (!ns) return NULL;
        ns->lit = tok_str(cur(P));
        target->a = ns;
        P->i += 2;
        if (cur(P)->kind != TK_NAME) {
            pfail(P, cur(P), "expected name", NULL);
            return NULL;
        }
        target->lit = tok_str(cur(P));
        P->i++;
    } else {
        if (!(target = parse_tuple(P, true, true, NULL, false))) return NULL;
        if (!assignable(target)) {
            pfail(P, t, "can't assign to this target", NULL);
            return NULL;
        }
    }
    if (is_op(P, OP_ASSIGN)) {
        P->i++;
        tpl_node *n = nnew(P, S_SET, t);
        if (!n) return NULL;
        n->a = target;
        if (!(n->b = parse_tuple(P, false, true, NULL, false)) || expect_bend(P)) return NULL;
        return n;
    }
    if (target->kind != N_NAME && target->kind != N_ATTR) {
        pfail(P, t, "block set needs a single name", NULL);
        return NULL;
    }
    tpl_node *n = nnew(P, S_SETBLOCK, t);
    if (!n) return NULL;
    n->a = target;
    if (is_op(P, OP_PIPE) && !(n->c = parse_filter(P, NULL, false))) return NULL;
    if (expect_bend(P)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    nlist body = {0};
    if (parse_body(P, ends, &body) || expect_end_tag(P, "endset")) return NULL;
    n->kids = body.v;
    n->nkids = body.n;
    return n;
}

static tpl_node *parse_macro(parser *P, const tpl_token *t) {
    tpl_node *n = nnew(P, S_MACRO, t);
    if (!n) return NULL;
    if (cur(P)->kind != TK_NAME) {
        pfail(P, cur(P), "expected macro name", NULL);
        return NULL;
    }
    n->lit = tok_str(cur(P));
    P->i++;
    if (expect_op(P, OP_LPAREN, "(")) return NULL;
    nlist params = {0};
    bool have_default = false;
    while (!is_op(P, OP_RPAREN)) {
        if (params.n && expect_op(P, OP_COMMA, ",")) return NULL;
        if (cur(P)->kind != TK_NAME) {
            pfail(P, cur(P), "expected parameter name", NULL);
            return NULL;
        }
        tpl_node *p = nnew(P, N_NAME, cur(P));
        if (!p) return NULL;
        p->lit = tok_str(cur(P));
        P->i++;
        if (is_op(P, OP_ASSIGN)) {
            P->i++;
            if (!(p->a = parse_expression(P, true))) return NULL;
            have_default = true;
        } else if (have_default) {
            pfail(P, cur(P), "non-default argument follows default argument", NULL);
            return NULL;
        }
        if (nl_push(P, &params, p)) return NULL;
    }
    P->i++;
    if (expect_bend(P)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    nlist body = {0};
    int saved_loops = P->loops;
    P->loops = 0;
    if (parse_body(P, ends, &body) || expect_end_tag(P, "endmacro")) return NULL;
    P->loops = saved_loops;
    n->kids = params.v;
    n->nkids = params.n;
    n->kids2 = body.v;
    n->nkids2 = body.n;
    return n;
}

static tpl_node *parse_statement(parser *P) {
    const tpl_token *t = cur(P); /* the tag name */
    if (t->kind != TK_NAME) {
        pfail(P, t, "tag name expected", NULL);
        return NULL;
    }
    if (++P->depth > MAX_NEST) {
        pfail(P, t, "statements nested too deeply", NULL);
        return NULL;
    }
    P->i++;
    tpl_node *n = NULL;
    if (tok_name(t, "for")) n = parse_for(P, t);
    else if (tok_name(t, "if")) n = parse_if(P, t);
    else if (tok_name(t, "set")) n = parse_set(P, t);
    else if (tok_name(t, "macro")) n = parse_macro(P, t);
    else if (tok_name(t, "break") || tok_name(t, "continue")) {
        if (!P->loops) {
            pfail(P, t, "'%s' outside of a loop", tok_name(t, "break") ? "break" : "continue");
            return NULL;
        }
        if (!(n = nnew(P, tok_name(t, "break") ? S_BREAK : S_CONTINUE, t)) || expect_bend(P)) return NULL;
    } else if (tok_name(t, "filter")) {
        if (!(n = nnew(P, S_FILTERBLOCK, t))) return NULL;
        if (!(n->a = parse_filter(P, NULL, true)) || expect_bend(P)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        nlist body = {0};
        if (parse_body(P, ends, &body) || expect_end_tag(P, "endfilter")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
    } else if (tok_name(t, "generation")) {
        if (!(n = nnew(P, S_BLOCK, t)) || expect_bend(P)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        nlist body = {0};
        if (parse_body(P, ends, &body) || expect_end_tag(P, "endgeneration")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
    } else {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(t->n < 60 ? t->n : 60), t->s);
        pfail(P, t, "Encountered unknown tag '%s'.", name);
        return NULL;
    }
    P->depth--;
    return n;
}

/* Parses statements until EOF (ends == NULL) or a {% name %} with name in ends
 * (left unconsumed, positioned at its TK_BBEGIN). */
static int parse_body(parser *P, const char *const *ends, nlist *out) {
    for (;;) {
        const tpl_token *t = cur(P);
        if (P->status) return -1;
        switch (t->kind) {
        case TK_EOF:
            if (ends) return pfail(P, t, "Unexpected end of template. Jinja was looking for '%s'.", ends[0]);
            return 0;
        case TK_TEXT: {
            tpl_node *n = nnew(P, S_TEXT, t);
            if (!n) return -1;
            n->lit = tok_str(t);
            P->i++;
            if (nl_push(P, out, n)) return -1;
            break;
        }
        case TK_VBEGIN: {
            P->i++;
            tpl_node *n = nnew(P, S_OUT, t);
            if (!n || !(n->a = parse_tuple(P, false, true, NULL, false))) return -1;
            if (expect_kind(P, TK_VEND, "end of print statement")) return -1;
            if (nl_push(P, out, n)) return -1;
            break;
        }
        case TK_BBEGIN: {
            const tpl_token *name = peek(P, 1);
            if (ends)
                for (int k = 0; ends[k]; k++)
                    if (tok_name(name, ends[k])) return 0;
            P->i++;
            tpl_node *n = parse_statement(P);
            if (!n || nl_push(P, out, n)) return -1;
            break;
        }
        default:
            return pfail(P, t, "unexpected %s", tok_desc(t));
        }
    }
}

int tpl_parse(tpl_arena *ar, const tpl_token *toks, int ntoks, tpl_node **out, hn_err *err) {
    parser P;
    memset(&P, 0, sizeof P);
    P.ar = ar;
    P.t = toks;
    P.n = ntoks;
    P.err = err;
    nlist body = {0};
    if (parse_body(&P, NULL, &body)) return -1;
    tpl_node *root = nnew(&P, S_BLOCK, &toks[0]);
    if (!root) return -1;
    root->kids = body.v;
    root->nkids = body.n;
    *out = root;
    return 0;
}
