package payloadstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ferrykit/ferry/envelope"
)

// Confirmation is what Confirm found and did.
type Confirmation int

const (
	// Present: the object was at its key.
	Present Confirmation = iota
	// RestoredFromQuarantine: ferry gc had moved the object to its
	// quarantine; Confirm copied it back to its key.
	RestoredFromQuarantine
	// Republished: the object was gone (gc had deleted it); Confirm
	// published it again from the producer's bytes.
	Republished
)

func (c Confirmation) String() string {
	switch c {
	case Present:
		return "present"
	case RestoredFromQuarantine:
		return "restored from quarantine"
	case Republished:
		return "republished"
	}
	return fmt.Sprintf("Confirmation(%d)", int(c))
}

// ErrPayloadLost: an acknowledged record references an object that ferry gc
// deleted before the acknowledgement arrived, and the producer no longer
// holds its bytes. It wraps ErrPayloadNotFound.
var ErrPayloadLost = fmt.Errorf("%w: deleted before the record's acknowledgement, and no bytes to publish it again", ErrPayloadNotFound)

// Confirm makes sure the object at fullPath is at its key after the
// acknowledgement of a record that references it (docs/OPERATIONS.md §4:
// the producer's half of gc's safety). ferry gc moves an object it finds
// unreferenced to "<topic>/.ferry-gc/q/<run>/<shard>/<id>" and deletes it
// after its settle time unless a record appended meanwhile references it; a
// record whose acknowledgement came later than that is seen too late. So,
// after the acknowledgement, Confirm:
//
//  1. Stats the key: there, done (Present). (A gc run that moves the
//     object after this sees the acknowledged record in its read or its
//     recheck: it is below the high watermark the recheck reads to.)
//  2. Looks for the object in the topic's quarantine folders (up to 8
//     copies, one per gc run), reads each copy as Download would read it at
//     its key (a sealed object
//     opens under its own key) and, when its size and SHA-256 are want's
//     (a content id names its SHA-256 when want is nil; with neither, an
//     encrypted store still authenticates it), copies it back as it is
//     (RestoredFromQuarantine); gc's own restore or delete of the
//     quarantined copy then leaves the key alone. A copy with other bytes
//     (damaged, or a stray file) is never brought back.
//  3. Stats the key again (gc may have restored it meanwhile), then calls
//     republish, when not nil, which must publish the same bytes at the same
//     key (Republished).
//
// Errors: ErrPayloadLost when the object cannot be brought back,
// ErrInvalidPath for a path outside the store, and the store's errors. A
// store without key-level operations (no ObjectStore) cannot be collected
// by ferry gc: Present.
func Confirm(ctx context.Context, s PayloadStore, fullPath string, want *Digest, republish func(context.Context) error) (Confirmation, error) {
	ops, err := Objects(s)
	if err != nil {
		return Present, nil
	}
	key, kp, err := ops.Root().KeyOf(fullPath)
	if err != nil {
		return Present, err
	}
	if _, err := ops.Stat(ctx, key); err == nil {
		return Present, nil
	} else if !errors.Is(err, ErrPayloadNotFound) {
		return Present, err
	}
	qs, err := findInQuarantine(ctx, ops, key, kp.Topic)
	if err != nil {
		return Present, err
	}
	if want == nil && isHexDigest(kp.ID) {
		want = &Digest{Size: -1}
		_, _ = hex.Decode(want.SHA256[:], []byte(kp.ID))
	}
	for _, q := range qs {
		ok, err := quarantinedIs(ctx, s, q, key, want)
		if err != nil && !errors.Is(err, ErrPayloadNotFound) {
			return Present, fmt.Errorf("confirming %s: reading its quarantined copy %s: %w", fullPath, q, err)
		}
		if !ok {
			continue // gone meanwhile, or not the record's bytes
		}
		raw := ops
		if e, isEnc := Unwrap(s).(*encryptedStore); isEnc {
			raw = e.objs // the seal is bound to key: copied as it is
		}
		if err := raw.Copy(ctx, q, key); err == nil {
			return RestoredFromQuarantine, nil
		}
		// Gone meanwhile (gc restored or deleted it): see below.
		break
	}
	if _, err := ops.Stat(ctx, key); err == nil {
		return Present, nil // restored by gc
	} else if !errors.Is(err, ErrPayloadNotFound) {
		return Present, err
	}
	if republish == nil {
		return Present, &Error{Op: "confirm", Path: fullPath, Err: ErrPayloadLost}
	}
	if err := republish(ctx); err != nil {
		return Present, fmt.Errorf("confirming %s: publishing it again: %w", fullPath, err)
	}
	return Republished, nil
}

// Digest is the size (-1: unknown) and SHA-256 of an object's bytes as
// Download returns them (the payload's, before any store encryption).
type Digest struct {
	Size   int64
	SHA256 [sha256.Size]byte
}

// keyReader reads an object at its key as it is stored (the stores of this
// package).
type keyReader interface {
	openKey(ctx context.Context, key string) (io.ReadCloser, error)
}

// quarantinedIs reports whether the object at qkey, read as Download would
// read it at key (an encrypted store opens and authenticates it under key),
// has want's size and digest. With want nil the whole object is read, so
// that an encrypted store authenticates it.
func quarantinedIs(ctx context.Context, s PayloadStore, qkey, key string, want *Digest) (bool, error) {
	u := Unwrap(s)
	e, enc := u.(*encryptedStore)
	if enc {
		u = Unwrap(e.PayloadStore)
	}
	kr, ok := u.(keyReader)
	if !ok {
		return false, nil
	}
	rc, err := kr.openKey(ctx, qkey)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	var r io.Reader = rc
	if enc {
		if r, err = e.open(ctx, rc, key); err != nil {
			if notSealedUnder(err) {
				return false, nil // not the record's object
			}
			return false, err // a KMS or store failure: it may be the record's
		}
	}
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		if enc && notSealedUnder(err) {
			return false, nil
		}
		return false, err
	}
	if want == nil {
		return true, nil
	}
	return (want.Size < 0 || n == want.Size) && [sha256.Size]byte(h.Sum(nil)) == want.SHA256, nil
}

// notSealedUnder reports whether err, from opening an object as an
// encrypted store reads it at a key, says the object was not sealed for
// that key (or not by this store's keys): its bytes are not sealed
// (ErrPlaintextRefused), do not authenticate or parse, its key is not
// configured, or the KMS refuses its wrapped key for good. A KMS or store
// failure that may pass (KMSError.Retryable, a download cut) is not that:
// the object may still be the record's.
func notSealedUnder(err error) bool {
	var ke *envelope.KMSError
	if errors.As(err, &ke) {
		return !ke.Retryable
	}
	return errors.Is(err, envelope.ErrAuthentication) || errors.Is(err, envelope.ErrFormat) ||
		errors.Is(err, envelope.ErrNotSealed) || errors.Is(err, envelope.ErrUnknownKey) || errors.Is(err, ErrPlaintextRefused)
}

// errFound stops a listing.
var errFound = errors.New("found")

// findInQuarantine returns the keys of the copies of the object at key in
// the topic's gc quarantine folders ("<topic>/.ferry-gc/q/<run>/<rest>",
// where key is "<topic>/<rest>"), at most maxQuarantineCopies.
func findInQuarantine(ctx context.Context, ops ObjectStore, key, topic string) ([]string, error) {
	prefix, err := GCPrefix(topic)
	if err != nil {
		return nil, err
	}
	prefix += "q/"
	rest := strings.TrimPrefix(key, topic+"/")
	var found []string
	err = ops.ListKeys(ctx, prefix, func(k string, _ ObjectInfo) error {
		_, r, ok := strings.Cut(strings.TrimPrefix(k, prefix), "/")
		if ok && r == rest {
			found = append(found, k)
			if len(found) == maxQuarantineCopies {
				return errFound
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return nil, err
	}
	return found, nil
}

// maxQuarantineCopies bounds the quarantined copies of one object Confirm
// reads (one per gc run that quarantined it; more is stray content).
const maxQuarantineCopies = 8
