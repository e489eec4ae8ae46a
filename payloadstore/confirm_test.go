//go:build !ferry_nocloud

package payloadstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ferrykit/ferry/envelope"
	"github.com/ferrykit/ferry/internal/faultproxy"
	"github.com/ferrykit/ferry/internal/storetest"
	"github.com/ferrykit/ferry/payloadstore"
)

// Confirm on the file and mem stores: an object at its key is Present; one
// in a gc quarantine folder is copied back (and the folder's copy left for
// gc); one gone is published again by republish, or is ErrPayloadLost
// (wrapping ErrPayloadNotFound) without it.
func TestConfirm(t *testing.T) {
	ctx := context.Background()
	for name, s := range map[string]payloadstore.PayloadStore{
		"mem":  payloadstore.NewMemStore("confirm", nil),
		"file": openFile(t),
	} {
		t.Run(name, func(t *testing.T) {
			ops, err := payloadstore.Objects(s)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte("the payload a record references")
			resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
			if err != nil {
				t.Fatal(err)
			}
			path := resp.FullPayloadPath
			key, err := ops.Root().Key(path)
			if err != nil {
				t.Fatal(err)
			}
			if c, err := payloadstore.Confirm(ctx, s, path, nil, nil); err != nil || c != payloadstore.Present {
				t.Fatalf("object at its key: %v %v", c, err)
			}

			// gc quarantined it.
			qkey := "orders/.ferry-gc/q/20260101T000000.000000000Z-00000000/" + strings.TrimPrefix(key, "orders/")
			if err := ops.Move(ctx, key, qkey); err != nil {
				t.Fatal(err)
			}
			if c, err := payloadstore.Confirm(ctx, s, path, nil, nil); err != nil || c != payloadstore.RestoredFromQuarantine {
				t.Fatalf("object in quarantine: %v %v", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, path); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after the copy back: %v", err)
			}
			if _, err := ops.Stat(ctx, qkey); err != nil {
				t.Fatalf("the quarantined copy is gc's to remove: %v", err)
			}

			// gc deleted it.
			if err := ops.Remove(ctx, qkey); err != nil {
				t.Fatal(err)
			}
			if err := ops.Remove(ctx, key); err != nil {
				t.Fatal(err)
			}
			_, err = payloadstore.Confirm(ctx, s, path, nil, nil)
			if !errors.Is(err, payloadstore.ErrPayloadLost) || !errors.Is(err, payloadstore.ErrPayloadNotFound) {
				t.Fatalf("gone, no bytes: %v, want ErrPayloadLost", err)
			}
			republished := false
			c, err := payloadstore.Confirm(ctx, s, path, nil, func(ctx context.Context) error {
				republished = true
				return ops.Put(ctx, key, body)
			})
			if err != nil || c != payloadstore.Republished || !republished {
				t.Fatalf("gone, with bytes: %v %v", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, path); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after republishing: %v", err)
			}
			if _, err := payloadstore.Confirm(ctx, s, "file:///elsewhere/orders/00/x", nil, nil); !errors.Is(err, payloadstore.ErrInvalidPath) {
				t.Fatalf("a path outside the store: %v", err)
			}
		})
	}
}

// quarantine moves the object at fullPath to a gc quarantine folder as
// ferry gc does (ObjectStore.Move: a sealed object moves as it is) and
// returns its quarantine key.
func quarantine(t *testing.T, s payloadstore.PayloadStore, fullPath string) (key, qkey string) {
	t.Helper()
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	key, kp, err := ops.Root().KeyOf(fullPath)
	if err != nil {
		t.Fatal(err)
	}
	qkey = kp.Topic + "/.ferry-gc/q/20260101T000000.000000000Z-00000000/" + strings.TrimPrefix(key, kp.Topic+"/")
	if err := ops.Move(context.Background(), key, qkey); err != nil {
		t.Fatal(err)
	}
	return key, qkey
}

// An encrypted store: gc moves the sealed object as it is, and Confirm
// copies it back to its key, where it opens (the seal is bound to that
// key), without the producer's bytes.
func TestConfirmEncryptedQuarantine(t *testing.T) {
	ctx := context.Background()
	for name, open := range map[string]func(*testing.T) payloadstore.PayloadStore{
		"mem": func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openMem(t), envelope.Config{KeyURL: randomKeyURL()}, false)
		},
		"file": func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openFile(t), envelope.Config{KeyURL: randomKeyURL()}, false)
		},
		"s3+awskms": func(t *testing.T) payloadstore.PayloadStore {
			kms := storetest.KMSKeyURL(t, "")
			return encrypt(t, openURL(t, s3URL(t, "ferry-confirm")), envelope.Config{KeyURL: kms}, false)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			body := []byte("a sealed payload that gc quarantined")
			resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
			if err != nil {
				t.Fatal(err)
			}
			quarantine(t, s, resp.FullPayloadPath)
			c, err := payloadstore.Confirm(ctx, s, resp.FullPayloadPath, nil, nil)
			if err != nil || c != payloadstore.RestoredFromQuarantine {
				t.Fatalf("Confirm of a quarantined sealed object: %v %v, want restored from quarantine", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after the copy back: %q %v", got, err)
			}
		})
	}
}

// An object in quarantine whose bytes are not the record's (a stray or
// damaged copy) is never brought back: Confirm republishes the producer's
// bytes, or reports ErrPayloadLost and leaves the key empty. A content id
// names its digest; a random id is checked against the digest the producer
// gives (the "-uuid" stores).
func TestConfirmWrongBytesInQuarantine(t *testing.T) {
	ctx := context.Background()
	cid := payloadstore.Options{IDGenerator: payloadstore.IDSHA256{}}
	for name, open := range map[string]func(*testing.T) payloadstore.PayloadStore{
		"file": func(t *testing.T) payloadstore.PayloadStore { return openOpts(t, "file://"+t.TempDir(), cid) },
		"mem":  func(t *testing.T) payloadstore.PayloadStore { return openOpts(t, "mem://confirm-cid-"+t.Name(), cid) },
		"encrypted": func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openOpts(t, "mem://confirm-cid-"+t.Name(), cid), envelope.Config{KeyURL: randomKeyURL()}, false)
		},
		"s3": func(t *testing.T) payloadstore.PayloadStore {
			return openOpts(t, s3URL(t, "ferry-confirm"), cid)
		},
		"s3+awskms-uuid": func(t *testing.T) payloadstore.PayloadStore {
			kms := storetest.KMSKeyURL(t, "")
			return encrypt(t, openURL(t, s3URL(t, "ferry-confirm")), envelope.Config{KeyURL: kms}, false)
		},
		"file-uuid": openFile,
		"mem-uuid":  openMem,
		"encrypted-uuid": func(t *testing.T) payloadstore.PayloadStore {
			return encrypt(t, openMem(t), envelope.Config{KeyURL: randomKeyURL()}, false)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ops, err := payloadstore.Objects(s)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte("the record's payload, named by its digest")
			var want *payloadstore.Digest
			if strings.HasSuffix(name, "-uuid") {
				want = &payloadstore.Digest{Size: int64(len(body)), SHA256: sha256.Sum256(body)}
			}
			resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
			if err != nil {
				t.Fatal(err)
			}
			path := resp.FullPayloadPath
			key, qkey := quarantine(t, s, path)
			// The quarantined copy is damaged (same key, other bytes).
			if err := ops.Put(ctx, qkey, []byte("other bytes, same name")); err != nil {
				t.Fatal(err)
			}
			_, err = payloadstore.Confirm(ctx, s, path, want, nil)
			if !errors.Is(err, payloadstore.ErrPayloadLost) {
				t.Errorf("Confirm without the bytes: %v, want ErrPayloadLost", err)
			}
			if _, err := ops.Stat(ctx, key); !errors.Is(err, payloadstore.ErrPayloadNotFound) {
				t.Errorf("the damaged copy was brought back to %s (%v)", key, err)
			}
			c, err := payloadstore.Confirm(ctx, s, path, want, func(ctx context.Context) error {
				kp, err := payloadstore.PathKey(path)
				if err != nil {
					return err
				}
				p := payloadstore.BytesPayload(body)
				p.ID = kp.ID
				_, err = s.Publish(ctx, "orders", p)
				return err
			})
			if err != nil || c != payloadstore.Republished {
				t.Fatalf("Confirm with the bytes: %v %v, want republished", c, err)
			}
			if got, err := payloadstore.DownloadBytes(ctx, s, path); err != nil || !bytes.Equal(got, body) {
				t.Fatalf("after Confirm: %q %v, want the record's bytes", got, err)
			}
		})
	}
}

func openOpts(t *testing.T, url string, o payloadstore.Options) payloadstore.PayloadStore {
	t.Helper()
	s, err := payloadstore.Open(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Two quarantine folders hold a copy of the object, the first listed one
// damaged: Confirm brings back the good one, even without the producer's
// bytes (a touch-rebound record has none).
func TestConfirmSkipsDamagedCopy(t *testing.T) {
	ctx := context.Background()
	s := openFile(t)
	ops, err := payloadstore.Objects(s)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("the record's payload")
	resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
	if err != nil {
		t.Fatal(err)
	}
	key, qkey := quarantine(t, s, resp.FullPayloadPath)
	damaged := strings.Replace(qkey, "20260101T000000.000000000Z-00000000", "00000000T000000.000000000Z-00000000", 1)
	if err := ops.Put(ctx, damaged, []byte("damaged")); err != nil {
		t.Fatal(err)
	}
	want := &payloadstore.Digest{Size: int64(len(body)), SHA256: sha256.Sum256(body)}
	c, err := payloadstore.Confirm(ctx, s, resp.FullPayloadPath, want, nil)
	if err != nil || c != payloadstore.RestoredFromQuarantine {
		t.Fatalf("Confirm: %v %v, want the good copy restored", c, err)
	}
	if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("at %s: %q %v", key, got, err)
	}
}

// Several producers confirm one content-id object (shared by their
// records) at once, while gc restores it from quarantine: every Confirm
// succeeds and the object holds its bytes.
func TestConfirmConcurrentContentID(t *testing.T) {
	ctx := context.Background()
	cid := payloadstore.Options{IDGenerator: payloadstore.IDSHA256{}}
	for name, open := range map[string]func(*testing.T) payloadstore.PayloadStore{
		"file": func(t *testing.T) payloadstore.PayloadStore { return openOpts(t, "file://"+t.TempDir(), cid) },
		"mem":  func(t *testing.T) payloadstore.PayloadStore { return openOpts(t, "mem://confirm-conc-"+t.Name(), cid) },
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ops, _ := payloadstore.Objects(s)
			body := []byte("shared by several records")
			for round := range 20 {
				resp, err := payloadstore.PublishBytes(ctx, s, "orders", body)
				if err != nil {
					t.Fatal(err)
				}
				key, qkey := quarantine(t, s, resp.FullPayloadPath)
				var wg sync.WaitGroup
				errs := make(chan error, 9)
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, err := payloadstore.Confirm(ctx, s, resp.FullPayloadPath, nil, func(ctx context.Context) error {
							_, err := payloadstore.PublishBytes(ctx, s, "orders", body)
							return err
						})
						errs <- err
					}()
				}
				wg.Add(1)
				go func() { // gc's restore
					defer wg.Done()
					if _, err := ops.Stat(ctx, key); err == nil {
						errs <- ops.Remove(ctx, qkey)
						return
					}
					if err := ops.Move(ctx, qkey, key); err != nil {
						if _, serr := ops.Stat(ctx, key); serr != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
				}
				if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, body) {
					t.Fatalf("round %d: %q %v", round, got, err)
				}
				_ = ops.Remove(ctx, qkey)
			}
		})
	}
}

// An encrypted store whose KMS is down when Confirm opens a quarantined
// copy (a proxy that started after the payload was sealed, so no data key
// is cached): the copy may be the record's, so Confirm reports the KMS's
// failure, not ErrPayloadLost (it took the copy for a stranger's and gave
// the record up); once the KMS answers, the copy comes back.
func TestConfirmEncryptedQuarantineKMSDown(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fileStore := func() payloadstore.PayloadStore {
		s, err := payloadstore.Open(ctx, "file://"+dir, payloadstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	sealer := encrypt(t, fileStore(), envelope.Config{KeyURL: storetest.KMSKeyURL(t, "")}, false)
	body := []byte("a sealed payload that gc quarantined")
	resp, err := payloadstore.PublishBytes(ctx, sealer, "orders", body)
	if err != nil {
		t.Fatal(err)
	}
	quarantine(t, sealer, resp.FullPayloadPath)

	viaURL, fp := storetest.KMSKeyURLViaFaultProxy(t, "")
	s := encrypt(t, fileStore(), envelope.Config{KeyURL: viaURL}, false)
	fp.Set(faultproxy.Down, -1)
	c, err := payloadstore.Confirm(ctx, s, resp.FullPayloadPath, nil, nil)
	if err == nil || errors.Is(err, payloadstore.ErrPayloadLost) || !errors.Is(err, envelope.ErrKMS) {
		t.Fatalf("Confirm with the KMS down: %v %v, want the KMS's error, not ErrPayloadLost", c, err)
	}
	fp.Set(faultproxy.Pass, 0)
	c, err = payloadstore.Confirm(ctx, s, resp.FullPayloadPath, nil, nil)
	if err != nil || c != payloadstore.RestoredFromQuarantine {
		t.Fatalf("Confirm with the KMS back: %v %v, want restored from quarantine", c, err)
	}
	if got, err := payloadstore.DownloadBytes(ctx, s, resp.FullPayloadPath); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("after the copy back: %q %v", got, err)
	}
}
