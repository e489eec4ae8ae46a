package interceptor

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Field rules of validate-schema: CEL expressions (Common Expression
// Language, cel.dev/cel-go), as Confluent's data contracts and Conduktor's
// data-quality policies write them, over the decoded record.
const (
	// KeyValidateSchemaRulePrefix: each key validate.schema.rule.NAME is a
	// rule named NAME, a CEL expression that must be true for the record,
	// e.g. validate.schema.rule.positive-amount = value.amount > 0. Its
	// variables: value and key (the decoded value and key, as maps of
	// their fields, or null when that side is not checked or is null) and
	// topic (a string). Avro unions read as {"<branch type>": value}
	// (value.note.string), Avro bytes and fixed as bytes, Protobuf
	// messages as maps by field name (enums as their numbers).
	KeyValidateSchemaRulePrefix = "validate.schema.rule."
	// KeyValidateSchemaRuleCostMax bounds one rule's evaluation on one
	// record in CEL's cost units (about one per operation and per item a
	// comprehension visits), default 1000000: a rule that would go over
	// it fails the record.
	KeyValidateSchemaRuleCostMax = "validate.schema.rules.cost.max"
)

// DefaultValidateSchemaRuleCostMax is validate.schema.rules.cost.max's
// default.
const DefaultValidateSchemaRuleCostMax = 1_000_000

// maxValidateSchemaRules bounds how many rules one interceptor holds.
const maxValidateSchemaRules = 100

// schemaRule is one compiled rule.
type schemaRule struct {
	name, expr string
	prg        cel.Program
}

// schemaRules compiles the validate.schema.rule.* keys of config, sorted
// by name (the order they are evaluated in). An expression that does not
// compile, or is not of type bool, is an error naming its key.
func schemaRules(config map[string]string) ([]schemaRule, error) {
	var names []string
	for k := range config {
		if name, ok := strings.CutPrefix(k, KeyValidateSchemaRulePrefix); ok {
			if name == "" {
				return nil, fmt.Errorf("%s: a rule needs a name after the prefix (%sNAME)", k, KeyValidateSchemaRulePrefix)
			}
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	if len(names) > maxValidateSchemaRules {
		return nil, fmt.Errorf("%d %s* rules, more than %d", len(names), KeyValidateSchemaRulePrefix, maxValidateSchemaRules)
	}
	slices.Sort(names)
	costMax, err := intKey(config, KeyValidateSchemaRuleCostMax, DefaultValidateSchemaRuleCostMax, 1, 1<<40)
	if err != nil {
		return nil, err
	}
	env, err := cel.NewEnv(
		cel.Variable("value", cel.DynType), cel.Variable("key", cel.DynType), cel.Variable("topic", cel.StringType),
		cel.CrossTypeNumericComparisons(true))
	if err != nil {
		return nil, err
	}
	rules := make([]schemaRule, 0, len(names))
	for _, name := range names {
		key := KeyValidateSchemaRulePrefix + name
		expr := strings.TrimSpace(config[key])
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			return nil, fmt.Errorf("%s: %q does not compile: %s", key, expr, oneLineErr(iss.Err()))
		}
		if ast.OutputType() != cel.BoolType && ast.OutputType() != cel.DynType {
			return nil, fmt.Errorf("%s: %q is of type %s, not bool", key, expr, ast.OutputType())
		}
		prg, err := env.Program(ast, cel.CostLimit(uint64(costMax)), cel.InterruptCheckFrequency(100))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		rules = append(rules, schemaRule{name: name, expr: expr, prg: prg})
	}
	return rules, nil
}

func oneLineErr(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// check evaluates every rule on the decoded sides (nil: not checked or
// null) and returns the first that is not true: false, not a bool, or an
// error (a field the record lacks, the cost bound, ctx ending).
func checkRules(ctx context.Context, rules []schemaRule, topic string, key, value any) error {
	vars := map[string]any{"topic": topic, "key": celValue(key), "value": celValue(value)}
	for _, r := range rules {
		out, _, err := r.prg.ContextEval(ctx, vars)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("rule %s (%s): %s", r.name, r.expr, oneLineErr(err))
		case out.Value() != true:
			return fmt.Errorf("rule %s (%s) is %v", r.name, r.expr, out.Value())
		}
	}
	return nil
}

// celValue turns a decoded side (schemareg.Registry.CheckDecode) into
// values CEL reads: Avro fixed ([N]byte) as bytes, Protobuf messages as
// maps by field name; JSON and Avro maps, lists and scalars as they are.
func celValue(v any) any {
	switch t := v.(type) {
	case nil:
		return nil
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = celValue(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = celValue(e)
		}
		return out
	case protoreflect.ProtoMessage:
		return protoMap(t.ProtoReflect())
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 {
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return b
	}
	return v
}

// protoMap is a Protobuf message as a map of its set fields by name.
func protoMap(m protoreflect.Message) map[string]any {
	out := map[string]any{}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			items := make([]any, l.Len())
			for i := range items {
				items[i] = protoScalar(fd, l.Get(i))
			}
			out[string(fd.Name())] = items
		case fd.IsMap():
			mm := map[string]any{}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				mm[k.String()] = protoScalar(fd.MapValue(), mv)
				return true
			})
			out[string(fd.Name())] = mm
		default:
			out[string(fd.Name())] = protoScalar(fd, v)
		}
		return true
	})
	return out
}

func protoScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return protoMap(v.Message())
	case protoreflect.EnumKind:
		return int64(v.Enum())
	}
	return v.Interface()
}
