// Command keys sends one request for each key in a range, with the key in
// the X-Key header, so that bench/load.sh can fill a rate limiter with a
// known number of distinct keys and measure the memory they take.
//
//	go run ./bench/keys -url http://127.0.0.1:8080/ -from 0 -to 20000
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
)

func main() {
	url := flag.String("url", "", "the site to send requests to")
	from := flag.Int("from", 0, "first key number")
	to := flag.Int("to", 0, "last key number, exclusive")
	workers := flag.Int("workers", 16, "concurrent connections")
	flag.Parse()
	if *url == "" || *to <= *from {
		log.Fatal("keys: -url and a non-empty -from/-to range are required")
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *workers}}
	next := atomic.Int64{}
	next.Store(int64(*from))
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for {
				k := next.Add(1) - 1
				if k >= int64(*to) {
					return
				}
				req, _ := http.NewRequest(http.MethodGet, *url, nil)
				req.Header.Set("X-Key", "key-"+strconv.FormatInt(k, 10))
				resp, err := client.Do(req)
				if err != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
					if err == nil {
						resp.Body.Close()
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		log.Fatalf("keys: %d of %d requests failed", n, *to-*from)
	}
	fmt.Println(*to - *from)
}
