package payloadstore

import (
	"fmt"

	"github.com/google/uuid"
)

// IDGenerator names objects (KIP-1159 PayloadStore.id(data)).
type IDGenerator interface {
	ID(p Payload) string
}

// IDUUID is the KIP's default: a random version-4 UUID per payload.
type IDUUID struct{}

func (IDUUID) ID(Payload) string { return uuid.NewString() }

// IDSHA256 is the content id: the payload's SHA-256 in lowercase hex. Equal
// payloads share one object, which is what compacted topics want (KIP-1159,
// "TTL and usage of Compacted Topic").
type IDSHA256 struct{}

func (IDSHA256) ID(p Payload) string { return p.HexSHA256() }

// ParseIDGenerator maps the value of large.message.payload.id.generator
// ("uuid" or "sha256"; empty means "uuid") to a generator.
func ParseIDGenerator(name string) (IDGenerator, error) {
	switch name {
	case "", "uuid":
		return IDUUID{}, nil
	case "sha256":
		return IDSHA256{}, nil
	}
	return nil, fmt.Errorf("large.message.payload.id.generator: %q is not one of uuid, sha256", name)
}
