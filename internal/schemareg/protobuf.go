package schemareg

import (
	"context"
	"fmt"

	"github.com/bufbuild/protocompile"
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
	md, err := p.message(indexes)
	if err != nil {
		return err
	}
	m := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{RecursionLimit: lim.MaxDepth}).Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: Protobuf %s: %v", ErrInvalidPayload, md.FullName(), err)
	}
	return nil
}
