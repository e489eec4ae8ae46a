package schemareg

import (
	"context"
	"fmt"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoSchema validates Protobuf payloads: the registry's schema text is
// compiled by bufbuild/protocompile (imports: only Google's well-known
// types), the framing's message indexes pick the message, and the payload
// is decoded into a dynamicpb message (google.golang.org/protobuf), with
// Limits.MaxDepth as its recursion limit.
type protoSchema struct {
	file protoreflect.FileDescriptor
}

const protoFileName = "ferry-registry-schema.proto"

func parseProtobuf(ctx context.Context, text string, refs []namedText) (*protoSchema, error) {
	// References are the files the schema imports, by import path.
	sources := map[string]string{protoFileName: text}
	for _, ref := range refs {
		if ref.name != protoFileName {
			sources[ref.name] = ref.text
		}
	}
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(sources),
		}),
	}
	files, err := c.Compile(ctx, protoFileName)
	if err != nil {
		return nil, fmt.Errorf("%w: Protobuf: %s", ErrBadSchema, oneLine(err.Error()))
	}
	return &protoSchema{file: files[0]}, nil
}

// message finds the message the indexes name: the first is a top-level
// message's index, each next one a nested message's.
func (p *protoSchema) message(indexes []int) (protoreflect.MessageDescriptor, error) {
	msgs := p.file.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range indexes {
		if i >= msgs.Len() {
			return nil, fmt.Errorf("%w: Protobuf message indexes %v name no message of the schema", ErrInvalidPayload, indexes)
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	if md == nil {
		return nil, fmt.Errorf("%w: Protobuf: the schema has no message", ErrInvalidPayload)
	}
	return md, nil
}

func (p *protoSchema) recordName(indexes []int) (string, error) {
	md, err := p.message(indexes)
	if err != nil {
		return "", err
	}
	return string(md.FullName()), nil
}

func (p *protoSchema) validate(_ context.Context, indexes []int, b []byte, lim Limits) error {
	_, err := p.unmarshal(indexes, b, lim)
	return err
}

// unmarshal decodes b into a dynamicpb message of the message indexes
// names, after counting its messages within lim.MaxMessages (a 2-byte
// empty message costs dynamicpb some 350 bytes, so a payload of them
// would claim 175 times its size). Errors wrap ErrInvalidPayload.
func (p *protoSchema) unmarshal(indexes []int, b []byte, lim Limits) (*dynamicpb.Message, error) {
	md, err := p.message(indexes)
	if err != nil {
		return nil, err
	}
	left := lim.MaxMessages
	if !countMessages(md, b, &left, 0, lim.MaxDepth) {
		return nil, fmt.Errorf("%w: Protobuf %s: more than %d nested messages and map entries in %d bytes", ErrInvalidPayload, md.FullName(), lim.MaxMessages, len(b))
	}
	m := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{RecursionLimit: lim.MaxDepth}).Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%w: Protobuf %s: %v", ErrInvalidPayload, md.FullName(), err)
	}
	return m, nil
}

// countMessages counts, into *left, the messages b holds for md (fields of
// message or group kind, map entries), and reports false once it goes
// below 0. Anything it cannot read (bad wire format, deeper than maxDepth)
// ends the count: the decoder reports it.
func countMessages(md protoreflect.MessageDescriptor, b []byte, left *int64, depth, maxDepth int) bool {
	if depth >= maxDepth {
		return true
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return true
		}
		b = b[n:]
		fd := fields.ByNumber(num)
		var sub []byte
		msg := false
		switch {
		case fd != nil && typ == protowire.BytesType && fd.Kind() == protoreflect.MessageKind: // maps too
			sub, n = protowire.ConsumeBytes(b)
			msg = true
		case fd != nil && typ == protowire.StartGroupType && fd.Kind() == protoreflect.GroupKind:
			sub, n = protowire.ConsumeGroup(num, b)
			msg = true
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return true
		}
		b = b[n:]
		if msg {
			if *left--; *left < 0 || !countMessages(fd.Message(), sub, left, depth+1, maxDepth) {
				return false
			}
		}
	}
	return true
}
