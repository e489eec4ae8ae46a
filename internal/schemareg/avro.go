package schemareg

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/hamba/avro/v2"
)

// avroSchema validates Avro binary payloads (Avro 1.11 specification,
// "Binary Encoding") against a schema parsed by hamba/avro. The walk reads
// and skips, allocating nothing per value, so the bounds are the payload's
// size, Limits.MaxDepth (nesting of records, arrays, maps and unions) and
// Limits.MaxItems (array and map items in one payload: an item of type null
// takes no bytes, so without it a 10-byte count would loop for ever).
type avroSchema struct {
	s    avro.Schema
	name string // the full name of a named top-level schema, else ""
}

func parseAvro(text string, refs []namedText) (*avroSchema, error) {
	// A fresh cache per schema: the package-level one would grow with every
	// schema the registry serves and mix their names. References are
	// parsed into it first, so that the schema can name their types.
	cache := &avro.SchemaCache{}
	for _, ref := range refs {
		if _, err := avro.ParseWithCache(ref.text, "", cache); err != nil {
			return nil, fmt.Errorf("%w: Avro reference %s: %v", ErrBadSchema, ref.name, err)
		}
	}
	s, err := avro.ParseWithCache(text, "", cache)
	if err != nil {
		return nil, fmt.Errorf("%w: Avro: %v", ErrBadSchema, err)
	}
	a := &avroSchema{s: s}
	if n, ok := s.(avro.NamedSchema); ok {
		a.name = n.FullName()
	}
	return a, nil
}

// avroWalk is one payload's validation state.
type avroWalk struct {
	ctx      context.Context
	b        []byte
	off      int
	items    int64 // array and map items left (Limits.MaxItems)
	maxDepth int
	steps    int
	// zeroLeft bounds, when the payload is to be decoded into values
	// (Limits.decoding), the values that take no bytes: nulls, records of
	// them, fixed of size 0. Each costs the decoder a slot or a map, so
	// without the bound a few bytes (an array count) would decode into
	// gigabytes. -1: not bounded (a walk alone allocates nothing).
	zeroLeft int64
}

// maxZeroWidthValues is what a payload may decode, beside one per byte of
// it, of values that take no bytes (see avroWalk.zeroLeft): an optional
// field that is null takes one byte (its union branch), so real records
// stay within len(payload); the allowance covers records with null-typed
// or empty-record fields.
const maxZeroWidthValues = 65536

func (a *avroSchema) validate(ctx context.Context, b []byte, lim Limits) error {
	w := &avroWalk{ctx: ctx, b: b, items: lim.MaxItems, maxDepth: lim.MaxDepth, zeroLeft: -1}
	if lim.decoding {
		w.zeroLeft = int64(len(b)) + maxZeroWidthValues
	}
	if err := w.value(a.s, 0); err != nil {
		return err
	}
	if w.off != len(b) {
		return fmt.Errorf("%w: Avro: %d bytes left after the value (of %d)", ErrInvalidPayload, len(b)-w.off, len(b))
	}
	return nil
}

func (w *avroWalk) fail(format string, args ...any) error {
	return fmt.Errorf("%w: Avro: at byte %d: %s", ErrInvalidPayload, w.off, fmt.Sprintf(format, args...))
}

func (w *avroWalk) long() (int64, error) {
	v, k := binary.Varint(w.b[w.off:])
	if k <= 0 {
		return 0, w.fail("truncated or overlong varint")
	}
	w.off += k
	return v, nil
}

func (w *avroWalk) skip(n int64, what string) error {
	if n < 0 || n > int64(len(w.b)-w.off) {
		return w.fail("%s of %d bytes, %d left", what, n, len(w.b)-w.off)
	}
	w.off += int(n)
	return nil
}

func (w *avroWalk) value(s avro.Schema, depth int) error {
	start := w.off
	if err := w.value1(s, depth); err != nil {
		return err
	}
	if _, ref := s.(*avro.RefSchema); w.off == start && w.zeroLeft >= 0 && !ref {
		if w.zeroLeft--; w.zeroLeft < 0 {
			return w.fail("more than %d values that take no bytes (nulls, empty records) in a payload of %d bytes: decoding it would allocate far more than its size (the bound is %d plus its size)",
				int64(len(w.b))+maxZeroWidthValues, len(w.b), maxZeroWidthValues)
		}
	}
	return nil
}

func (w *avroWalk) value1(s avro.Schema, depth int) error {
	if depth > w.maxDepth {
		return w.fail("nested deeper than %d", w.maxDepth)
	}
	// The time budget: a long walk (many small items) checks now and then.
	if w.steps++; w.steps&0xfff == 0 && w.ctx.Err() != nil {
		return w.ctx.Err()
	}
	switch t := s.(type) {
	case *avro.RefSchema:
		return w.value(t.Schema(), depth) // the named type's own level counts
	case *avro.RecordSchema:
		for _, f := range t.Fields() {
			if err := w.value(f.Type(), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.UnionSchema:
		i, err := w.long()
		if err != nil {
			return err
		}
		types := t.Types()
		if i < 0 || i >= int64(len(types)) {
			return w.fail("union branch %d of %d", i, len(types))
		}
		return w.value(types[i], depth+1)
	case *avro.ArraySchema:
		return w.blocks(depth, func() error { return w.value(t.Items(), depth+1) })
	case *avro.MapSchema:
		return w.blocks(depth, func() error {
			n, err := w.long()
			if err != nil {
				return err
			}
			if err := w.skip(n, "map key"); err != nil {
				return err
			}
			return w.value(t.Values(), depth+1)
		})
	case *avro.EnumSchema:
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(t.Symbols())) {
			return w.fail("enum symbol %d of %d", i, len(t.Symbols()))
		}
		return nil
	case *avro.FixedSchema:
		return w.skip(int64(t.Size()), "fixed")
	}
	return w.primitive(s.Type()) // null, primitives and logical types over them
}

func (w *avroWalk) primitive(t avro.Type) error {
	switch t {
	case avro.Null:
		return nil
	case avro.Boolean:
		if w.off >= len(w.b) {
			return w.fail("truncated boolean")
		}
		if w.b[w.off] > 1 {
			return w.fail("boolean byte %d", w.b[w.off])
		}
		w.off++
		return nil
	case avro.Int:
		v, err := w.long()
		if err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
			err = w.fail("int %d out of range", v)
		}
		return err
	case avro.Long:
		_, err := w.long()
		return err
	case avro.Float:
		return w.skip(4, "float")
	case avro.Double:
		return w.skip(8, "double")
	case avro.String, avro.Bytes:
		n, err := w.long()
		if err != nil {
			return err
		}
		return w.skip(n, string(t))
	}
	return w.fail("schema type %s is not supported", t)
}

// blocks reads an array's or map's blocks: a count (negative: its absolute
// value, followed by the block's byte size), the items, until a count of 0.
func (w *avroWalk) blocks(depth int, item func() error) error {
	if depth+1 > w.maxDepth {
		return w.fail("nested deeper than %d", w.maxDepth)
	}
	for {
		n, err := w.long()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if n < 0 {
			if n == math.MinInt64 {
				return w.fail("block count out of range")
			}
			n = -n
			if _, err := w.long(); err != nil { // the block's size in bytes
				return err
			}
		}
		if n > w.items {
			return w.fail("more array or map items than the bound %d", w.items)
		}
		w.items -= n
		for ; n > 0; n-- {
			if err := item(); err != nil {
				return err
			}
		}
	}
}
