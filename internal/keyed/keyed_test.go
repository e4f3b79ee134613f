package keyed

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestLockSerialisesPerKeyAndForgetsFreeKeys(t *testing.T) {
	var l Locks[string]
	ctx := context.Background()
	var mu sync.Mutex
	inside := map[string]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		key := []string{"a", "b"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.Lock(ctx, key)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside[key]++
			if inside[key] != 1 {
				t.Errorf("%d holders of %s", inside[key], key)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inside[key]--
			mu.Unlock()
			unlock()
		}()
	}
	wg.Wait()
	if n := l.Len(); n != 0 {
		t.Fatalf("%d entries left after every holder released", n)
	}
}

func TestLockGivesUpWhenContextEnds(t *testing.T) {
	var l Locks[int]
	unlock, err := l.Lock(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter on a held lock: got %v, want deadline exceeded", err)
	}
	if err := l.Wait(ctx, 1); err == nil {
		t.Fatal("Wait on a held lock returned nil after ctx ended")
	}
	unlock()
	if err := l.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("%d entries left", n)
	}
}
