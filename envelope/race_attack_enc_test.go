package envelope

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
)

// Security review of issue #13 (held): 16 goroutines seal and open objects
// and records of 3 topics while data keys rotate every 1 to 3 uses (a KMS
// call per rotation, goroutines racing for the slot) and the opening cache
// holds 2 entries (evictions all the time): every object and record opens
// to its own bytes, under go test -race.
func TestAttackEncConcurrentRotation(t *testing.T) {
	for _, uses := range []int64{1, 2, 3} {
		t.Run(fmt.Sprintf("uses=%d", uses), func(t *testing.T) {
			k := openTest(t, Config{KeyURL: testKeyURL(t), DataKeyMaxUses: uses, CacheMaxEntries: 2})
			ctx := context.Background()
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 40 {
						topic := fmt.Sprintf("t%d", (g+i)%3)
						plain := bytes.Repeat([]byte{byte(g), byte(i)}, 100+g*i)
						a := PayloadAAD{Topic: topic, Key: fmt.Sprintf("%s/00/%d-%d", topic, g, i)}
						sealed, _ := seal(t, k, plain, a)
						got, err := open(k, sealed, a)
						if err != nil || !bytes.Equal(got, plain) {
							t.Errorf("object %d/%d: %v", g, i, err)
							return
						}
						ra := RecordAAD{Topic: topic, Field: "value"}
						sr, err := k.SealRecord(ctx, nil, plain, ra)
						if err != nil {
							t.Error(err)
							return
						}
						pr, err := k.OpenRecord(ctx, nil, sr, ra)
						if err != nil || !bytes.Equal(pr, plain) {
							t.Errorf("record %d/%d: %v", g, i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}
